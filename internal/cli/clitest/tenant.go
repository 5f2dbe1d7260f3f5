// Package clitest holds checks that the consumer's and the publisher's
// command tests share.
package clitest

import (
	"errors"
	"strings"
	"testing"

	"github.com/toolq/toolq/internal/cli"
)

// EmptyTenantRefused runs each command of cmds (a group named in groups:
// each of its commands) with `--tenant ""`, as --tenant "$TENANT" with the
// variable unset gives it, and fails t unless the command has no such flag
// or refuses the empty value as a usage error naming it: none may take
// the call for the default tenant's.
func EmptyTenantRefused(t *testing.T, cmds *cli.Commands, groups map[string]*cli.Commands, run func(args ...string) error) {
	t.Helper()
	var paths [][]string
	for _, c := range cmds.List {
		if g, ok := groups[c.Name]; ok {
			for _, sub := range g.List {
				paths = append(paths, []string{c.Name, sub.Name})
			}
			continue
		}
		paths = append(paths, []string{c.Name})
	}
	for _, path := range paths {
		err := run(append(path, "--tenant", "")...)
		var exit *cli.ExitError
		switch {
		case err != nil && strings.Contains(err.Error(), "flag provided but not defined: -tenant"):
		case errors.As(err, &exit) && exit.Code == cli.ExitUsage && strings.Contains(err.Error(), "--tenant"):
		default:
			t.Errorf("%s --tenant \"\": %v, want no such flag or a usage error naming --tenant", strings.Join(path, " "), err)
		}
	}
}
