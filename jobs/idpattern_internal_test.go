package jobs

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestIDPatternsMatchTheirRule: the byte loop against the regexp on
// every string of one and two bytes, every three-byte string over an
// alphabet of boundary bytes, every single code point (alone, after an
// ASCII prefix, and at each end of a string at the length limit), invalid
// UTF-8, a trailing newline (Go's $ is \z, not Perl's), and lengths around
// the limit counted in bytes versus runes.
func TestIDPatternsMatchTheirRule(t *testing.T) {
	patterns := []idPattern{conversationIDPattern, toolNamePattern, toolUseIDPattern}
	n := 0
	check := func(s string) {
		n++
		for _, p := range patterns {
			if got, want := p.MatchString(s), p.re.MatchString(s); got != want {
				t.Fatalf("%s on %q: loop %v, regexp %v", p, s, got, want)
			}
		}
	}
	for a := range 256 {
		check(string([]byte{byte(a)}))
		for b := range 256 {
			check(string([]byte{byte(a), byte(b)}))
		}
	}
	edge := []byte("\x00\t\n\r ,-./09:;@AZ[\\]^_`az{|}~\x7f\x80\xbf\xc0\xc2\xe2\xed\xf0\xf4\xf5\xff")
	for _, a := range edge {
		for _, b := range edge {
			for _, c := range edge {
				check(string([]byte{a, b, c}))
			}
		}
	}
	for r := rune(0); r <= utf8.MaxRune; r++ {
		if r > 0x3000 && r < 0xD000 || r > 0xE100 && r < 0xFF00 || r > 0x10100 && r < 0x10FF00 {
			continue // the middle of the planes: nothing special there
		}
		s := string(r)
		check(s)
		check("a" + s)
		check(s + "a")
	}
	for _, limit := range []int{64, 128} {
		for l := limit - 3; l <= limit+3; l++ {
			base := strings.Repeat("a", l)
			check(base)
			check(base + "\n")
			check("\n" + base)
			for _, r := range []string{"é", "€", "😀", "\u0131", "\u212a", "\xff", "\xc3", "\u00a0", "ſ", "K"} {
				// Fewer runes than bytes: a rune-counting {1,max} and a
				// byte-counting loop could disagree here were either to
				// accept a non-ASCII character.
				check(base[:l/2] + r + base[l/2:])
				check(r + base)
				check(base + r)
				if l > len(r) {
					check(base[len(r):] + r)
				}
			}
		}
	}
	check("abc\n")
	check("abc\r\n")
	check("abc$")
	check("^abc")
	t.Logf("%d strings, no difference", n)
}
