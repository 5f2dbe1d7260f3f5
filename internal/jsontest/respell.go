package jsontest

import (
	"math/rand/v2"
	"strconv"
	"strings"
)

// Respelled writes one random JSON object twice, the second time with the
// members of every object in another order, other whitespace, and every
// string and number spelled another way: escapes where a literal would do
// (\u00e9 for é, a surrogate pair for 👍, \/ for /) and numbers as 1, 1.0,
// 1e0, 10E-1, 0.1e1, -0 as 0. Names are drawn mostly from characters that
// make orders disagree (see runePool). The two texts are one value: they have
// one canonical form, and so one key.
func Respelled(rng *rand.Rand) (string, string) {
	v := randomNode(rng, 0, true)
	var a, b strings.Builder
	v.write(&a, rng, false)
	v.write(&b, rng, true)
	return a.String(), b.String()
}

// node is a JSON value kept apart from any spelling of it.
type node struct {
	kind    byte // 'l' literal, 'n' number, 's' string, 'a' array, 'o' object
	text    string
	num     decimal
	items   []node
	names   []string
	members []node
}

// decimal is ±digits × 10^exp; digits has no leading zero ("0" for zero).
type decimal struct {
	neg    bool
	digits string
	exp    int
}

func randomNode(rng *rand.Rand, depth int, object bool) node {
	kind := rng.IntN(8)
	if object {
		kind = 7
	} else if depth >= 4 {
		kind = rng.IntN(5)
	}
	switch kind {
	case 0:
		return node{kind: 'l', text: []string{"null", "true", "false"}[rng.IntN(3)]}
	case 1, 2:
		return node{kind: 'n', num: randomDecimal(rng)}
	case 3, 4:
		return node{kind: 's', text: randomString(rng)}
	case 5, 6:
		n := node{kind: 'a'}
		for range rng.IntN(4) {
			n.items = append(n.items, randomNode(rng, depth+1, false))
		}
		return n
	}
	n := node{kind: 'o'}
	seen := map[string]bool{}
	for range rng.IntN(7) {
		name := randomName(rng)
		if seen[name] {
			continue
		}
		seen[name] = true
		n.names = append(n.names, name)
		n.members = append(n.members, randomNode(rng, depth+1, false))
	}
	return n
}

// orderPool is what names are mostly made of: characters on either side of
// every boundary where UTF-16 order, code point order and the first code
// unit disagree.
var orderPool = []rune{'a', 'b', 'é', '\ue000', '\uffff', '😀', '👍', '👎', '𝄞', '𝄢', '\U0010FFFE', '\U0010FFFF'}

func randomName(rng *rand.Rand) string {
	if rng.IntN(4) == 0 {
		return randomString(rng)
	}
	var r []rune
	for range 1 + rng.IntN(3) {
		r = append(r, orderPool[rng.IntN(len(orderPool))])
	}
	return string(r)
}

// randomDecimal is a number whose every spelling is accepted: at most 15
// significant digits, well inside ±2^53.
func randomDecimal(rng *rand.Rand) decimal {
	if rng.IntN(6) == 0 {
		return decimal{neg: rng.IntN(2) == 0, digits: "0"}
	}
	digits := strconv.Itoa(1 + rng.IntN(9))
	for range rng.IntN(6) {
		digits += strconv.Itoa(rng.IntN(10))
	}
	return decimal{neg: rng.IntN(3) == 0, digits: digits, exp: rng.IntN(15) - 8}
}

func (n node) write(b *strings.Builder, rng *rand.Rand, shuffle bool) {
	switch n.kind {
	case 'l':
		b.WriteString(n.text)
	case 'n':
		b.WriteString(n.num.spell(rng))
	case 's':
		writeString(b, rng, n.text)
	case 'a':
		b.WriteString("[" + space(rng))
		for i, item := range n.items {
			if i > 0 {
				b.WriteString("," + space(rng))
			}
			item.write(b, rng, shuffle)
		}
		b.WriteString(space(rng) + "]")
	case 'o':
		order := make([]int, len(n.names))
		for i := range order {
			order[i] = i
		}
		if shuffle {
			order = rng.Perm(len(order))
		}
		b.WriteString("{")
		for i, m := range order {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(space(rng))
			writeString(b, rng, n.names[m])
			b.WriteString(space(rng) + ":" + space(rng))
			n.members[m].write(b, rng, shuffle)
		}
		b.WriteString(space(rng) + "}")
	}
}

// spell writes the number one of many ways: plain, with trailing zeros
// after a point, in exponent form with e or E and an optional sign, with the
// digits shifted against the exponent.
func (d decimal) spell(rng *rand.Rand) string {
	sign := ""
	if d.neg {
		sign = "-"
	}
	if d.digits == "0" {
		return sign + []string{"0", "0.0", "0e0", "0E+5", "0.000e-3"}[rng.IntN(5)]
	}
	shift := rng.IntN(3)
	digits, exp := d.digits+strings.Repeat("0", shift), d.exp-shift
	switch rng.IntN(3) {
	case 0: // 10E-1
		return sign + digits + []string{"e", "E"}[rng.IntN(2)] + exponent(rng, exp)
	case 1: // 1.0e0, 0.1e1
		lead := rng.IntN(2) // digits before the point: none ("0.") or one
		if lead == 0 {
			return sign + "0." + digits + "e" + exponent(rng, exp+len(digits))
		}
		frac := digits[1:]
		if frac == "" {
			frac = "0"
		}
		return sign + digits[:1] + "." + frac + "E" + exponent(rng, exp+len(digits)-1)
	}
	// Plain decimal: 1, 1.0, 0.001.
	switch {
	case exp >= 0:
		s := sign + digits + strings.Repeat("0", exp)
		if rng.IntN(2) == 0 {
			s += "." + strings.Repeat("0", 1+rng.IntN(2))
		}
		return s
	case len(digits) > -exp:
		return sign + digits[:len(digits)+exp] + "." + digits[len(digits)+exp:]
	}
	return sign + "0." + strings.Repeat("0", -exp-len(digits)) + digits
}

func exponent(rng *rand.Rand, e int) string {
	if e >= 0 && rng.IntN(2) == 0 {
		return "+" + strconv.Itoa(e)
	}
	return strconv.Itoa(e)
}
