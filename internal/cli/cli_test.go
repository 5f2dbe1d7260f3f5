package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/version"
)

func TestParseInterspersed(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	fs := cli.NewFlagSet("show", "consumer ledger show KEY [--json]", cli.IO{Out: &out})
	asJSON := fs.Bool("json", false, "print JSON")
	pos, help, err := cli.Parse(fs, []string{"abc", "--json", "def"})
	if err != nil || help || !*asJSON || strings.Join(pos, ",") != "abc,def" {
		t.Fatalf("pos %v help %v json %v err %v", pos, help, *asJSON, err)
	}
	_, help, err = cli.Parse(fs, []string{"--help"})
	if !help || err != nil || !strings.Contains(out.String(), "usage: consumer ledger show KEY") || !strings.Contains(out.String(), "-json") {
		t.Fatalf("help: %v %v %q", help, err, out.String())
	}
	fs2 := cli.NewFlagSet("p", "p x", cli.IO{Out: &out})
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

// TestADurationInDaysDoesNotWrapAround: "213504d" (585 years, meant as
// "everything") overflows time.Duration; it is refused, not taken for the
// 25 minutes it wraps around to.
func TestADurationInDaysDoesNotWrapAround(t *testing.T) {
	t.Parallel()
	d, err := cli.ParseDuration("213504d")
	if err == nil && d < 100000*24*time.Hour {
		t.Fatalf("ParseDuration(\"213504d\") = %v, no error", d)
	}
	for _, bad := range []string{"213504d", "106751d24h", "106752d"} {
		if d, err := cli.ParseDuration(bad); err == nil {
			t.Errorf("%q: %v, no error", bad, d)
		}
	}
	if d, err := cli.ParseDuration("106751d"); err != nil || d != 106751*24*time.Hour {
		t.Errorf("106751d, the most days there are room for: %v %v", d, err)
	}
}

func TestPrintable(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"toolu_1":                  "toolu_1",
		"👍 ünïcode 👨\u200d👩":       "👍 ünïcode 👨\u200d👩", // a joiner between emoji stays
		"🏳\ufe0f\u200d🌈 👋🏽\u200d👍": "🏳\ufe0f\u200d🌈 👋🏽\u200d👍",
		"toolu_\u200d1 \u200d👍":    `toolu_\u200d1 \u200d👍`,
		"toolu_\u200b1\ufeff":      `toolu_\u200b1\ufeff`,
		`toolu_\x1b`:               `toolu_\x1b`, // a backslash prints as itself
		"\x1b]0;t\a\x1b[2Jx":       `\x1b]0;t\a\x1b[2Jx`,
		"a\tb\nc\r\x7f":            `a\tb\nc\r\x7f`,
		"\u009b2J \u202egnp.exe":   `\u009b2J \u202egnp.exe`,
		"\x9b2J a\xffb":            `\x9b2J a\xffb`,
		"a\xffb\t":                 `a\xffb\t`,
		"toolu_\u2028x\u2029":      `toolu_\u2028x\u2029`,
	} {
		if got := cli.Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// A lone byte 0x9b is the 8-bit CSI a terminal with 8-bit controls (or a
// non-UTF-8 locale) obeys: an invalid job body can carry it.
func TestPrintableEscapesAByteThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"\x9b2J", "job \x9d0;owned\x9c ok", "\x8d\x9b31m"} {
		got := cli.Printable(in)
		for i := 0; i < len(got); i++ {
			if got[i] >= 0x80 && got[i] <= 0x9f && !utf8.ValidString(got) {
				t.Errorf("Printable(%q) = %q: the raw C1 byte %#x reaches the terminal", in, got, got[i])
				break
			}
		}
	}
}

// An invalid byte reads the same whether or not a control character is
// beside it, and is the byte the text holds, not U+FFFD.
func TestPrintableWritesAnInvalidByteTheSameBesideAControl(t *testing.T) {
	t.Parallel()
	alone, withTab := cli.Printable("a\xffb"), cli.Printable("a\xffb\t")
	if strings.Contains(withTab, "\uFFFD") || !strings.HasPrefix(withTab, alone) {
		t.Errorf("Printable(%q) = %q but Printable(%q) = %q: the byte 0xff is shown two ways", "a\xffb", alone, "a\xffb\t", withTab)
	}
}

// U+2028 and U+2029 end a line in some terminals and editors: they would
// break a table row.
func TestPrintableEscapesLineAndParagraphSeparators(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"toolu_\u2028x", "toolu_\u2029x"} {
		if got := cli.Printable(in); got == in {
			t.Errorf("Printable(%q) = %q, unescaped", in, got)
		}
	}
}

// TestPrintableTellsApartTextsThatDifferByAnInvisibleCharacter: two
// tool_use_ids or keys that differ by a character a terminal shows as
// nothing (a format character) print differently (replay, ledger show).
// A backslash prints as itself, so text holding the four characters \x1b
// prints as an escaped ESC does: not checked here.
func TestPrintableTellsApartTextsThatDifferByAnInvisibleCharacter(t *testing.T) {
	t.Parallel()
	for _, pair := range [][2]string{
		{"toolu_1", "toolu_\u200b1"}, // a zero-width space
		{"toolu_1", "toolu_1\u2060"}, // a word joiner
		{"toolu_1", "\ufefftoolu_1"}, // a BOM
		{"toolu_1", "toolu_\u00ad1"}, // a soft hyphen
		{"toolu_1", "toolu_\u200c1"}, // a zero-width non-joiner
		{"toolu_1", "toolu_\u200d1"}, // a zero-width joiner, not between emoji
	} {
		a, b := cli.Printable(pair[0]), cli.Printable(pair[1])
		if a == b || visible(a) == visible(b) {
			t.Errorf("Printable(%q) = %q and Printable(%q) = %q look the same on a terminal", pair[0], a, pair[1], b)
		}
	}
}

// visible drops what a terminal shows as nothing.
func visible(s string) string {
	var out []rune
	for _, r := range s {
		switch r {
		case '\u200b', '\u2060', '\ufeff', '\u00ad', '\u200c', '\u200d':
			continue
		}
		out = append(out, r)
	}
	return string(out)
}

func TestCommands(t *testing.T) {
	t.Parallel()
	var ran []string
	cmd := func(name string) cli.Func {
		return func(_ context.Context, args []string, stdio cli.IO, _ func(string) string) error {
			ran = append(ran, name+" "+strings.Join(args, " "))
			if len(args) > 0 && args[0] == "--help" {
				return cli.ErrHelp
			}
			return nil
		}
	}
	group := &cli.Commands{Name: "bin group", List: []cli.Command{{Name: "a", Run: cmd("a")}, {Name: "b", Run: cmd("b")}}}
	top := &cli.Commands{Name: "bin", Default: "run", List: []cli.Command{
		{Name: "run", Summary: "do it", Run: cmd("run")},
		{Name: "group", Summary: "a or b", Run: group.Run},
	}}
	for _, tc := range []struct {
		args      []string
		ran, out  string
		errSubstr string
	}{
		{args: nil, ran: "run "},
		{args: []string{"--x", "1"}, ran: "run --x 1"},
		{args: []string{"run", "--help"}, ran: "run --help"},
		{args: []string{"group", "b", "k"}, ran: "b k"},
		{args: []string{"--help"}, out: "usage: bin [command] [flags]\n\ncommands:\n  run    (the default) do it\n  group  a or b\n\nRun 'bin <command> --help' for the flags of a command.\n"},
		{args: []string{"group", "help"}, out: "usage: bin group <command> [flags]"},
		{args: []string{"frob"}, errSubstr: `unknown command "frob" (want run or group)`},
		{args: []string{"group"}, errSubstr: "group: want a command: a or b"},
		{args: []string{"group", "c"}, errSubstr: `group: unknown command "c" (want a or b)`},
	} {
		ran = nil
		var out strings.Builder
		err := top.Run(context.Background(), tc.args, cli.IO{Out: &out, Err: &out}, func(string) string { return "" })
		switch {
		case tc.errSubstr != "":
			if err == nil || !strings.Contains(err.Error(), tc.errSubstr) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%q: err %v, want %q", tc.args, err, tc.errSubstr)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.ran != "" && strings.Join(ran, ";") != tc.ran:
			t.Errorf("%q ran %q, want %q", tc.args, ran, tc.ran)
		case tc.out != "" && !strings.HasPrefix(out.String(), tc.out):
			t.Errorf("%q printed %q, want %q", tc.args, out.String(), tc.out)
		}
	}
}

func TestExit(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	if cli.Exit(&out, "bin", nil) != 0 || cli.Exit(&out, "bin", cli.ErrHelp) != 0 || out.Len() != 0 {
		t.Fatalf("success: %q", out.String())
	}
	if code := cli.Exit(&out, "bin", errors.New("no such key")); code != 1 || out.String() != "bin: no such key\n" {
		t.Fatalf("failure: %d %q", code, out.String())
	}
}

func TestPrintJSON(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	if err := cli.PrintJSON(&out, map[string]any{"a": []int{1}}); err != nil || out.String() != "{\n  \"a\": [\n    1\n  ]\n}\n" {
		t.Fatalf("%q %v", out.String(), err)
	}
}

func TestVersionIsACommandAndAFlag(t *testing.T) {
	c := &cli.Commands{Name: "tq", Default: "run", List: []cli.Command{{Name: "run", Run: func(context.Context, []string, cli.IO, func(string) string) error {
		return errors.New("ran the default command")
	}}, cli.Version("tq")}}
	for _, args := range [][]string{{"--version"}, {"-version"}, {"version"}} {
		var out strings.Builder
		if err := c.Run(context.Background(), args, cli.IO{Out: &out, Err: io.Discard}, func(string) string { return "" }); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if want := "tq " + version.Get().String() + "\n"; out.String() != want {
			t.Fatalf("%v printed %q, want %q", args, out.String(), want)
		}
	}
	var out strings.Builder
	if err := c.Run(context.Background(), []string{"version", "--json"}, cli.IO{Out: &out, Err: io.Discard}, func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	var got version.Info
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil || got != version.Get() {
		t.Fatalf("version --json: %q (%v)", out.String(), err)
	}
}

func TestEveryFlagHasItsEnvironmentVariable(t *testing.T) {
	t.Parallel()
	newFlags := func(out io.Writer) (*flag.FlagSet, *int, *string, *string) {
		fs := cli.NewFlagSet("run", "run [flags]", cli.IO{Out: out})
		return fs, fs.Int("max-deliver", 10, "deliveries"), fs.String("nats-url", "", "NATS"), fs.String("database-url", "", "ledger")
	}
	env := map[string]string{"TOOLQ_MAX_DELIVER": "3", "NATS_URL": "nats://n:4222", "DATABASE_URL": "postgres://d"}
	fs, maxDeliver, natsURL, dbURL := newFlags(io.Discard)
	if err := cli.BindEnv(fs, func(k string) string { return env[k] }, "TOOLQ_"); err != nil {
		t.Fatal(err)
	}
	if err := cli.ParseNone(fs, []string{"--max-deliver", "5"}); err != nil {
		t.Fatal(err)
	}
	if *maxDeliver != 5 || *natsURL != "nats://n:4222" || *dbURL != "postgres://d" {
		t.Fatalf("max-deliver %d (the command line wins), nats-url %q, database-url %q (from the environment)", *maxDeliver, *natsURL, *dbURL)
	}
	fs, _, _, _ = newFlags(io.Discard)
	err := cli.BindEnv(fs, func(k string) string { return map[string]string{"TOOLQ_MAX_DELIVER": "many"}[k] }, "TOOLQ_")
	var ee *cli.ExitError
	if !errors.As(err, &ee) || ee.Code != cli.ExitUsage || !strings.Contains(err.Error(), `TOOLQ_MAX_DELIVER="many"`) {
		t.Fatalf("a value the flag refuses: %v", err)
	}
	var help strings.Builder
	fs, _, _, _ = newFlags(&help)
	cli.BindEnv(fs, func(string) string { return "" }, "TOOLQ_")
	if _, _, err := cli.Parse(fs, []string{"--help"}); err != nil {
		t.Fatal(err)
	}
	if cli.EnvName("TOOLQ_", "nats-listen") != "TOOLQ_NATS_LISTEN" {
		t.Errorf("--nats-listen (toolq's embedded server) is %s", cli.EnvName("TOOLQ_", "nats-listen"))
	}
	for _, name := range []string{"TOOLQ_MAX_DELIVER", "NATS_URL", "DATABASE_URL"} {
		if strings.Count(help.String(), "(env "+name+")") != 1 {
			t.Errorf("--help names %s %d times:\n%s", name, strings.Count(help.String(), name), help.String())
		}
	}
}
