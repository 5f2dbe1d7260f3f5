package tools

import (
	"log/slog"
	"os"
)

// Config is what NewRegistry, Parse and Load take besides the tools
// themselves. The zero value is ready to use: each nil field gets the
// default named on it.
type Config struct {
	// Logger receives the circuit breakers' state changes (nil:
	// slog.Default()).
	Logger *slog.Logger
	// Getenv resolves the ${VAR} references of a registry file in its
	// executors' URLs and headers (nil: os.Getenv); ${file:/path} reads the
	// file. A registry file is trusted configuration: with os.Getenv it can
	// send any variable of the process, and any file it can read,
	// downstream, so give files you do not control a narrower function.
	// NewRegistry does not use it.
	Getenv func(string) string
	// Builtins are the Go executors a registry file can name with
	// `builtin: name`. NewRegistry does not use it: a Definition holds its
	// Executor.
	Builtins map[string]Executor
	// TxBuiltins are the Go executors of transactional_write tools that a
	// registry file can name with `builtin: name`. NewRegistry does not use
	// it: a Definition holds its TxExecutor.
	TxBuiltins map[string]TxExecutor
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	return c
}
