package jobs

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestIDPatternsMatchTheirRule: the byte loop that checks conversation ids,
// tool names and tool_use_ids accepts exactly what the stated pattern does.
func TestIDPatternsMatchTheirRule(t *testing.T) {
	inputs := []string{"", "a", "A-z_0", "c:1", "a.b", "a|b", "a b", "é", "a\x00", strings.Repeat("a", 64), strings.Repeat("a", 65),
		strings.Repeat("x", 128), strings.Repeat("x", 129)}
	for c := range 256 {
		inputs = append(inputs, string([]byte{byte(c)}), "ab"+string([]byte{byte(c)}))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "aZ09_-:.|* >\x7f\xff"
	for range 2000 {
		b := make([]byte, rng.IntN(140))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		inputs = append(inputs, string(b))
	}
	for _, p := range []idPattern{conversationIDPattern, toolNamePattern, toolUseIDPattern} {
		for _, s := range inputs {
			if got, want := p.MatchString(s), p.re.MatchString(s); got != want {
				t.Errorf("%s on %q: %v, the rule says %v", p, s, got, want)
			}
		}
	}
}
