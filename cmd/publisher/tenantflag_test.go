package main

import (
	"testing"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/cli/clitest"
)

// TestNoCommandTakesAnEmptyTenant: every publisher command, given
// `--tenant ""`, either has no such flag or refuses the empty value as a
// usage error naming it, before it connects or publishes. A command added
// with a --tenant flag is held to it here.
func TestNoCommandTakesAnEmptyTenant(t *testing.T) {
	t.Parallel()
	clitest.EmptyTenantRefused(t, commands, map[string]*cli.Commands{"dlq": dlqCommands}, func(args ...string) error {
		_, err := runPublisher(t, "", args...)
		return err
	})
}
