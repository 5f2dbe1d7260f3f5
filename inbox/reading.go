package inbox

// What a person reads of a text: the characters that do not show, and the
// keys and strings that read as others (lookalikes). Args are a model's
// output, and an approver decides on what they read.

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// unseen reports whether r may not show as a character of its own, so that
// a text holding it reads as another: controls, format characters
// (bidirectional overrides, zero-width characters, tags), every space but
// U+0020, line and paragraph separators, private-use and unassigned code
// points, U+FFFD (which stands for what was not UTF-8), and the
// Default_Ignorable_Code_Points that Go calls printable: variation
// selectors, the combining grapheme joiner U+034F, the Hangul fillers
// U+115F, U+1160, U+3164 and U+FFA0, and the Khmer inherent vowels; and
// the blank braille pattern U+2800, which draws nothing.
func unseen(r rune) bool {
	switch {
	case r == ' ':
		return false
	case r < utf8.RuneSelf:
		return r < ' ' || r == 0x7f
	case r == utf8.RuneError || r == 0x2800:
		return true
	case !unicode.IsPrint(r) || unicode.Is(unicode.Cf, r):
		return true
	}
	return unicode.In(r, unicode.Variation_Selector, unicode.Other_Default_Ignorable_Code_Point)
}

// escape writes r as a JSON escape: \u202e, or a surrogate pair past the
// Basic Multilingual Plane.
func escape(b *strings.Builder, r rune) {
	if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
		fmt.Fprintf(b, `\u%04x\u%04x`, r1, r2)
	} else {
		fmt.Fprintf(b, `\u%04x`, r)
	}
}

// quote is s as a JSON string literal in which every character that does
// not show is escaped (\n, \u202e), and whether there was one.
func quote(s string) (string, bool) {
	var b strings.Builder
	hidden := false
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case unseen(r):
			hidden = true
			escape(&b, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String(), hidden
}

// shown is the JSON text js with every character that does not show
// written as a \u escape. JSON holds no control character but its
// whitespace (tab, newline, carriage return, left as they are), and
// outside its strings only ASCII that shows: the characters escaped are
// all inside strings, and shown is the same JSON value (not the same
// bytes: the digest is over js).
func shown(js string) string {
	escaped := func(r rune) bool { return r != '\t' && r != '\n' && r != '\r' && unseen(r) }
	if !strings.ContainsFunc(js, escaped) {
		return js
	}
	var b strings.Builder
	for _, r := range js {
		if escaped(r) {
			escape(&b, r)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// mixedScripts names the scripts of the letters of the first word of s
// that mixes them, as UTS #39 would refuse an identifier ("раypal" mixes
// Cyrillic and Latin), or returns nil. A word is a run of letters, marks
// and digits; Latin may go with Han and Japanese kana, with Han and
// Bopomofo, or with Han and Hangul (UTS #39's highly restrictive level).
func mixedScripts(s string) []string {
	for word := range strings.FieldsFuncSeq(s, func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsMark(r) && !unicode.IsDigit(r)
	}) {
		var scripts []string
		for _, r := range word {
			if name := scriptOf(r); name != "" && !slices.Contains(scripts, name) {
				scripts = append(scripts, name)
			}
		}
		if len(scripts) > 1 && !allowedMix(scripts) {
			slices.Sort(scripts)
			return scripts
		}
	}
	return nil
}

// allowedMix reports whether the scripts are a mix of one writing system.
func allowedMix(scripts []string) bool {
	for _, set := range [][]string{
		{"Latin", "Han", "Hiragana", "Katakana"},
		{"Latin", "Han", "Bopomofo"},
		{"Latin", "Han", "Hangul"},
	} {
		if !slices.ContainsFunc(scripts, func(s string) bool { return !slices.Contains(set, s) }) {
			return true
		}
	}
	return false
}

// commonScripts are looked up first; Common and Inherited (digits,
// punctuation, combining marks) belong to no script of their own.
var commonScripts = []string{"Latin", "Cyrillic", "Greek", "Armenian", "Han", "Hiragana", "Katakana", "Hangul", "Arabic", "Hebrew"}

// scriptOf is the name of the script of the letter r, or "" for a
// character of none (Common, Inherited) or not a letter.
func scriptOf(r rune) string {
	if !unicode.IsLetter(r) {
		return ""
	}
	if r < utf8.RuneSelf {
		return "Latin"
	}
	for _, name := range commonScripts {
		if unicode.Is(unicode.Scripts[name], r) {
			return name
		}
	}
	for name, table := range unicode.Scripts {
		if name != "Common" && name != "Inherited" && unicode.Is(table, r) {
			return name
		}
	}
	return ""
}

// confusables maps the letters of other scripts that are drawn as Latin
// letters (or as each other) to them: a small table of the common
// Cyrillic, Greek and Armenian lookalikes of UTS #39's confusables, with
// 1, I and | as l and 0 as O, as its skeletons have them. Fullwidth ASCII
// is mapped apart; other lookalikes (letters with diacritics composed or
// not, rarer scripts) are not in it.
var confusables = map[rune]rune{
	// Cyrillic
	'а': 'a', 'е': 'e', 'о': 'o', 'р': 'p', 'с': 'c', 'у': 'y', 'х': 'x', 'і': 'i', 'ј': 'j', 'ѕ': 's',
	'һ': 'h', 'ԁ': 'd', 'ԛ': 'q', 'ԝ': 'w', 'ӏ': 'l', 'ү': 'y', 'ɡ': 'g',
	'А': 'A', 'В': 'B', 'Е': 'E', 'К': 'K', 'М': 'M', 'Н': 'H', 'О': 'O', 'Р': 'P', 'С': 'C', 'Т': 'T',
	'Х': 'X', 'Ѕ': 'S', 'І': 'l', 'Ј': 'J', 'Ү': 'Y', 'Ԛ': 'Q', 'Ԝ': 'W', 'Ӏ': 'l',
	// Greek
	'α': 'a', 'ο': 'o', 'ν': 'v', 'ρ': 'p', 'υ': 'u', 'ι': 'i', 'γ': 'y', 'ϲ': 'c', 'ϳ': 'j',
	'Α': 'A', 'Β': 'B', 'Ε': 'E', 'Ζ': 'Z', 'Η': 'H', 'Ι': 'l', 'Κ': 'K', 'Μ': 'M', 'Ν': 'N', 'Ο': 'O',
	'Ρ': 'P', 'Τ': 'T', 'Υ': 'Y', 'Χ': 'X',
	// Armenian
	'օ': 'o', 'ս': 'u', 'հ': 'h', 'ո': 'n',
	// Latin and Common
	'ɑ': 'a', 'ı': 'i', 'ℓ': 'l', 'I': 'l', '1': 'l', '|': 'l', '0': 'O',
}

// skeleton is what s reads as: its characters that do not show dropped,
// its lookalikes (confusables, fullwidth ASCII) as the letters they look
// like, and "rn" as "m". Two strings with one skeleton read alike.
func skeleton(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case unseen(r):
			continue
		case r >= 0xff01 && r <= 0xff5e: // fullwidth ASCII
			r -= 0xfee0
		}
		if c, ok := confusables[r]; ok {
			r = c
		}
		b.WriteRune(r)
	}
	return strings.ReplaceAll(b.String(), "rn", "m")
}
