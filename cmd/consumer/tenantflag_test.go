package main

import (
	"testing"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/cli/clitest"
)

// TestNoCommandTakesAnEmptyTenant: every consumer command, given
// `--tenant ""`, either has no such flag or refuses the empty value as a
// usage error naming it, before it does anything. A command added with a
// --tenant flag is held to it here.
func TestNoCommandTakesAnEmptyTenant(t *testing.T) {
	t.Parallel()
	clitest.EmptyTenantRefused(t, commands, map[string]*cli.Commands{"tools": toolsCommands, "ledger": ledgerCommands}, func(args ...string) error {
		_, err := runConsumer(t, map[string]string{"TOOLQ_DATA_DIR": t.TempDir(), "NATS_URL": "nats://127.0.0.1:1"}, args...)
		return err
	})
}
