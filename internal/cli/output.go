package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"
)

// PrintJSON writes v to w as what every --json prints: one JSON document,
// indented by two spaces, ending in a newline. It returns the encoding or
// write error.
func PrintJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// NewTable returns the writer of every human-readable table: cells separated
// by tabs are aligned in columns two spaces apart. Flush it at the end.
func NewTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// Printable is s with what a terminal may obey, break a line at or show as
// nothing written as Go escapes: control characters (C0, DEL, C1: \x1b, \n,
// \u0085), format characters (Unicode's Cf: the bidi controls \u202e, the
// zero-width space \u200b, the word joiner \u2060, the BOM \ufeff, the
// soft hyphen \u00ad), the line and paragraph separators (\u2028, \u2029),
// and each byte that is not UTF-8 (\x9b, which a terminal with 8-bit
// controls takes for CSI). A zero-width joiner between two emoji stays, so
// that 👨\u200d👩 reads as the one it draws; elsewhere it is escaped. It is
// for text an agent or a tool wrote that a command prints on an operator's
// terminal: there it moves no cursor, sets no window title, stays in its
// table cell, and two texts that differ print differently, except that a
// backslash is left as it is (dlq show prints JSON bodies, whose escapes
// must read as written): text holding the four characters \x1b prints as
// itself, like an escaped ESC. --json output keeps the text as it is: JSON
// is for programs, and encoding/json writes a bidi control raw, so a
// program that shows it must escape it.
func Printable(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, unprintable) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unprintable(r) && !(r == zeroWidthJoiner && joinsEmoji(s[:i], s[i+n:])):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func unprintable(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

const zeroWidthJoiner = '\u200d'

// joinsEmoji reports whether a zero-width joiner between before and after
// joins two emoji: a symbol (with its variation selector or skin tone)
// before it, a symbol after it.
func joinsEmoji(before, after string) bool {
	p, _ := utf8.DecodeLastRuneInString(before)
	q, _ := utf8.DecodeRuneInString(after)
	skinTone := p >= '\U0001F3FB' && p <= '\U0001F3FF'
	return (unicode.Is(unicode.So, p) || p == '\ufe0f' || skinTone) && unicode.Is(unicode.So, q)
}
