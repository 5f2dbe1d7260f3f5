package cli

import (
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
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

// Printable is s with its control characters (C0, DEL, C1) and bidi
// controls written as Go escapes (\x1b, \n, \u202e), for text an agent
// wrote that a command prints on an operator's terminal: there it moves no
// cursor, sets no window title, and stays in its table cell. --json
// output, which escapes them itself, keeps the text as it is.
func Printable(s string) string {
	if !strings.ContainsFunc(s, unprintable) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if !unprintable(r) {
			b.WriteRune(r)
			continue
		}
		q := strconv.QuoteRune(r)
		b.WriteString(q[1 : len(q)-1])
	}
	return b.String()
}

func unprintable(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}
