package cli_test

import (
	"bytes"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/cli"
)

func TestParseInterspersed(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	fs := cli.NewFlagSet("show", "consumer ledger show KEY [--json]", cli.IO{Err: &out})
	asJSON := fs.Bool("json", false, "print JSON")
	pos, help, err := cli.Parse(fs, []string{"abc", "--json", "def"})
	if err != nil || help || !*asJSON || strings.Join(pos, ",") != "abc,def" {
		t.Fatalf("pos %v help %v json %v err %v", pos, help, *asJSON, err)
	}
	_, help, err = cli.Parse(fs, []string{"--help"})
	if !help || err != nil || !strings.Contains(out.String(), "usage: consumer ledger show KEY") || !strings.Contains(out.String(), "-json") {
		t.Fatalf("help: %v %v %q", help, err, out.String())
	}
	fs2 := cli.NewFlagSet("p", "p x", cli.IO{Err: &out})
	fs2.Int("n", 0, "")
	if _, _, err := cli.Parse(fs2, []string{"-n", "x"}); err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("bad value: %v", err)
	}
	if _, _, err := cli.Parse(flag.NewFlagSet("q", flag.ContinueOnError), []string{"--", "-x"}); err != nil {
		t.Fatal(err)
	}
}

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"90m": 90 * time.Minute, "30d": 720 * time.Hour, "1d12h": 36 * time.Hour} {
		if got, err := cli.ParseDuration(in); err != nil || got != want {
			t.Errorf("%s: %v %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "xd", "3", "-1d", "1dx"} {
		if _, err := cli.ParseDuration(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
