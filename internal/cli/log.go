package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
)

// NewLogger returns a logger that writes to out in format (text or json) at
// level (debug, info, warn or error); a bad value is an error that names the
// flag (--log-format, --log-level).
func NewLogger(out io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(out, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(out, opts)), nil
	}
	return nil, errors.New("--log-format: want text or json")
}
