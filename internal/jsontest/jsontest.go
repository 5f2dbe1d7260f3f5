// Package jsontest generates random JSON documents for the tests of toolq's
// canonicalization and keys: non-ASCII and astral-plane strings and names,
// control characters, escapes where a literal would do, numbers in every
// spelling, nesting and irregular whitespace. It never writes a duplicate
// member name, nor a number the contract refuses.
package jsontest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// RandomObject writes a random JSON object in a deliberately irregular spelling:
// escapes where a literal would do, random whitespace, numbers in every form.
func RandomObject(rng *rand.Rand) string {
	var b strings.Builder
	writeObject(&b, rng, 0)
	return b.String()
}

func writeObject(b *strings.Builder, rng *rand.Rand, depth int) {
	b.WriteString("{")
	seen := map[string]bool{}
	n := rng.IntN(6)
	first := true
	for range n {
		name := randomString(rng)
		if seen[name] {
			continue
		}
		seen[name] = true
		if !first {
			b.WriteString(",")
		}
		first = false
		b.WriteString(space(rng))
		writeString(b, rng, name)
		b.WriteString(space(rng) + ":" + space(rng))
		writeValue(b, rng, depth+1)
	}
	b.WriteString(space(rng) + "}")
}

func writeValue(b *strings.Builder, rng *rand.Rand, depth int) {
	kind := rng.IntN(8)
	if depth > 4 {
		kind = rng.IntN(5)
	}
	switch kind {
	case 0:
		b.WriteString([]string{"null", "true", "false"}[rng.IntN(3)])
	case 1, 2:
		b.WriteString(randomNumber(rng))
	case 3, 4:
		writeString(b, rng, randomString(rng))
	case 5, 6:
		b.WriteString("[")
		for i := range rng.IntN(4) {
			if i > 0 {
				b.WriteString("," + space(rng))
			}
			writeValue(b, rng, depth+1)
		}
		b.WriteString("]")
	default:
		writeObject(b, rng, depth)
	}
}

func space(rng *rand.Rand) string { return []string{"", "", " ", "\n\t", "  \r\n"}[rng.IntN(5)] }

// randomNumber spells a random number, avoiding (2^53, 1e21): numbers there are
// refused, since their canonical form would be an integer beyond 2^53.
func randomNumber(rng *rand.Rand) string {
	for {
		s := randomNumberAnyRange(rng)
		f, _ := strconv.ParseFloat(s, 64)
		if a := math.Abs(f); a <= 1<<53 || a >= 1e21 {
			return s
		}
	}
}

func randomNumberAnyRange(rng *rand.Rand) string {
	switch rng.IntN(6) {
	case 0:
		return strconv.FormatInt(rng.Int64N(1<<53)-(1<<52), 10)
	case 1:
		return strconv.FormatFloat(rng.NormFloat64()*1e6, 'f', -1, 64)
	case 2:
		return strconv.FormatFloat(math.Float64frombits(rng.Uint64()&^(0x7FF<<52)|uint64(rng.IntN(0x7FF))<<52), 'e', -1, 64)
	case 3:
		return fmt.Sprintf("%dE%+d", rng.IntN(1000)-500, rng.IntN(60)-30)
	case 4:
		return fmt.Sprintf("%d.%03d", rng.IntN(100)-50, rng.IntN(1000))
	default:
		return strconv.FormatFloat(rng.Float64()*math.Pow(10, float64(rng.IntN(40)-20)), 'g', -1, 64)
	}
}

// runePool holds the characters that make orders disagree: ASCII, Latin-1
// and BMP letters, U+E000–U+FFFF (after every astral character in UTF-16,
// before none in code point order), and astral characters that share a high
// surrogate (👍 👎 😀 on U+D83D, 𝄞 𝄢 on U+D834, the last plane on U+DBFF),
// whose second code units decide their order.
var runePool = []rune{'a', 'Z', '0', ' ', '"', '\\', '/', '\n', '\t', '\x00', '\x1f', '\x7f', 'é', 'ö', '€',
	'\u0080', '\u2028', '\ufb33', '\ue000', '\uffff', '\ufffd', '😀', '👍', '👎', '𝄞', '𝄢',
	'\U00100000', '\U0010FFFE', '\U0010FFFF'}

func randomString(rng *rand.Rand) string {
	var r []rune
	for range rng.IntN(6) {
		r = append(r, runePool[rng.IntN(len(runePool))])
	}
	return string(r)
}

// writeString spells s with a random mix of literal characters and escapes.
func writeString(b *strings.Builder, rng *rand.Rand, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\' || r == '/' && rng.IntN(4) == 0:
			b.WriteString(`\` + string(r))
		case r < 0x20 || rng.IntN(4) == 0:
			if r >= 0x10000 {
				r -= 0x10000
				fmt.Fprintf(b, `\u%04x\u%04X`, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
			} else {
				fmt.Fprintf(b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}
