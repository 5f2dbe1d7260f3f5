package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
)

// TestTheInboxFlagsAreRefusedBeforeAnythingStarts: an inbox needs its
// approvers (a token file, or one operator on a loopback address); its
// other flags need --approvals-listen; each mistake is a usage error that
// says what to give instead, before the consumer starts anything.
func TestTheInboxFlagsAreRefusedBeforeAnythingStarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("approvers: [{name: alice, groups: [finance], token_env: ALICE_TOKEN}]\n"), 0o600)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--approvals-tokens", bad}, "--approvals-listen"},
		{[]string{"--approvals-listen", "127.0.0.1:0"}, "--approvals-tokens FILE"},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-as", "ops-desk"}, "--approvals-groups"},
		{[]string{"--approvals-listen", "0.0.0.0:0", "--approvals-as", "ops-desk", "--approvals-groups", "finance"}, "loopback"},
		{[]string{"--approvals-listen", ":8080", "--approvals-as", "ops-desk", "--approvals-groups", "finance"}, "loopback"},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-as", "ops-desk", "--approvals-groups", "fin.ance"}, `"fin.ance"`},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-tokens", bad, "--approvals-as", "x"}, "not both"},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-tokens", bad}, "ALICE_TOKEN is not set"},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-tokens", filepath.Join(dir, "none.yaml")}, "no such file"},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-as", "x", "--approvals-groups", "g", "--approvals-tls-cert", "c.pem"}, "go together"},
	} {
		var out, errOut testenv.Buffer
		args := append([]string{"--data-dir", filepath.Join(dir, "data")}, c.args...)
		err := run(context.Background(), args, cli.IO{Out: &out, Err: &errOut}, func(string) string { return "" })
		var ee *cli.ExitError
		if !errors.As(err, &ee) || ee.Code != cli.ExitUsage || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want a usage error saying %q", c.args, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
		t.Error("the consumer started something before refusing its flags")
	}
}
