package cli

import (
	"encoding/json"
	"io"
	"text/tabwriter"
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
