package jcs

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// LegacyCanonical returns the canonical form that toolq wrote before member
// names were ordered by all their UTF-16 code units, or nil when it is the
// same as Canonical. The legacy order compared only the first code unit of
// the first character that differs, so two names that first differ at
// characters above U+FFFF sharing a high surrogate (👍 U+1F44D and 👎
// U+1F44E) compared equal and kept the order they were written in. Only an
// object with two such names can be written differently; for any other value
// this returns nil without writing anything.
//
// It exists so that a ledger row written under the key of the legacy form
// can still be found: it is never a key toolq derives for a new call.
func (v *Value) LegacyCanonical() []byte {
	if !v.mayOrderDifferently() {
		return nil
	}
	var buf bytes.Buffer
	v.appendCanonical(&buf, compareLegacy)
	if bytes.Equal(buf.Bytes(), v.Canonical()) {
		return nil
	}
	return buf.Bytes()
}

// mayOrderDifferently reports whether v holds an object with two member
// names that both contain a character above U+FFFF: the only names that the
// legacy order and RFC 8785's can sort differently.
func (v *Value) mayOrderDifferently() bool {
	switch v.Kind {
	case KindArray:
		for i := range v.Array {
			if v.Array[i].mayOrderDifferently() {
				return true
			}
		}
	case KindObject:
		astral := 0
		for i := range v.Members {
			if hasAstral(v.Members[i].Name) {
				astral++
			}
			if astral == 2 || v.Members[i].Value.mayOrderDifferently() {
				return true
			}
		}
	}
	return false
}

// hasAstral reports whether s has a character above U+FFFF: in UTF-8, a
// four-byte sequence, whose lead byte is 0xF0 or above.
func hasAstral(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0xF0 {
			return true
		}
	}
	return false
}

// compareLegacy is the member order of toolq before RFC 8785's was fixed,
// kept byte for byte: at the first character that differs it compares only
// the first UTF-16 code unit of each, so two characters that share a high
// surrogate compare equal, and so do the names.
func compareLegacy(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			return firstUTF16Unit(ra) - firstUTF16Unit(rb)
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b)
}

// firstUTF16Unit is the first UTF-16 code unit of r.
func firstUTF16Unit(r rune) int {
	if r >= 0x10000 {
		hi, _ := utf16.EncodeRune(r)
		return int(hi)
	}
	return int(r)
}
