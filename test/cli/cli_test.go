// Package cli_test runs the built binaries as a script or an orchestrator
// would: their exit codes, and a consumer started before NATS and Postgres.
package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/worker"
)

func TestMain(m *testing.M) {
	testenv.Main(m, func() {
		if bin != "" {
			os.RemoveAll(bin)
		}
	})
}

var (
	buildOnce sync.Once
	bin       string // the directory of the built consumer, publisher and sandbox
	buildErr  error
)

// binaries builds consumer, publisher and sandbox once for the package's tests.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "toolq-cli-bin-")
		if err != nil {
			buildErr = err
			return
		}
		out, err := exec.Command("go", "build", "-o", dir+"/", "github.com/toolq/toolq/cmd/consumer", "github.com/toolq/toolq/cmd/publisher", "github.com/toolq/toolq/cmd/sandbox").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		bin = dir
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin
}

// run runs a binary and returns its exit code, standard output and error.
func run(t *testing.T, name string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binaries(t), name), args...)
	cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errOut.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errOut.String()
	}
	t.Fatalf("%s %v: %v", name, args, err)
	return 0, "", ""
}

// TestExitCodes: every exit code a script can branch on, from the binaries
// themselves.
func TestExitCodes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stack, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer stack.Close()
	if _, err := stack.StartWorker(ctx, worker.Config{RetryDelay: 10 * time.Millisecond, Consumer: worker.Consumer{MaxDeliver: 2}}); err != nil {
		t.Fatal(err)
	}
	refused, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	nowhere := fmt.Sprintf("127.0.0.1:%d", refused)
	publish := func(tool, id, args string) []string {
		return []string{"publish", "--nats-url", stack.NATSURL, "--conversation", "exit", "--turn", "1", "--tool", tool, "--tool-use-id", id, "--args", args, "--wait", "--timeout", "30s"}
	}
	payment := `{"invoice_id":"inv_exit","amount_cents":100,"currency":"EUR"}`
	for _, c := range []struct {
		name   string
		faults sandbox.Faults
		binary string
		args   []string
		want   int
	}{
		{"a call that completed", sandbox.Faults{}, "publisher", publish("send_payment", "toolu_ok", payment), cli.ExitOK},
		{"--version", sandbox.Faults{}, "consumer", []string{"--version"}, cli.ExitOK},
		{"a tool's own error result", sandbox.Faults{ErrorRate: 1}, "publisher", publish("send_payment", "toolu_declined", `{"invoice_id":"inv_exit_2","amount_cents":100,"currency":"EUR"}`), cli.ExitFailure},
		{"an unknown flag", sandbox.Faults{}, "publisher", []string{"publish", "--no-such-flag"}, cli.ExitUsage},
		{"an unknown command", sandbox.Faults{}, "publisher", []string{"frobnicate"}, cli.ExitUsage},
		{"no command", sandbox.Faults{}, "publisher", nil, cli.ExitUsage},
		{"a missing argument", sandbox.Faults{}, "consumer", []string{"ledger", "resolve"}, cli.ExitUsage},
		{"NATS unreachable", sandbox.Faults{}, "publisher", []string{"status", "--nats-url", "nats://" + nowhere}, cli.ExitUnavailable},
		{"NATS unreachable at the consumer's start", sandbox.Faults{}, "consumer", []string{"--nats-url", "nats://" + nowhere, "--startup-wait", "0", "--data-dir", t.TempDir()}, cli.ExitUnavailable},
		{"the ledger unreachable", sandbox.Faults{}, "consumer", []string{"ledger", "ls", "--database-url", "postgres://toolq@" + nowhere + "/toolq?connect_timeout=2"}, cli.ExitUnavailable},
		{"a rejected call", sandbox.Faults{}, "publisher", publish("no_such_tool", "toolu_rejected", `{}`), cli.ExitRejected},
		{"a call whose key cannot be derived", sandbox.Faults{}, "publisher", []string{"key", "--conversation", "c", "--turn", "1", "--tool", "t", "--args", `{"a":1,"a":2}`}, cli.ExitRejected},
		{"an indeterminate call", sandbox.Faults{DropAfterEffectRate: 1}, "publisher", publish("create_ticket", "toolu_unknown", `{"title":"exit codes","body":"b"}`), cli.ExitIndeterminate},
	} {
		if err := stack.Sandbox.SetFaults(c.faults); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := run(t, c.binary, c.args...)
		if code != c.want {
			t.Errorf("%s: %s %v exited %d, want %d\nstdout: %s\nstderr: %s", c.name, c.binary, c.args, code, c.want, out, errOut)
		}
	}
}

// TestConsumerStartedBeforeNATSAndPostgresComesUpWhenTheyDo: started with
// neither reachable, the consumer waits (its /readyz says for what), and
// once both come up it connects, migrates the ledger and answers a call.
func TestConsumerStartedBeforeNATSAndPostgresComesUpWhenTheyDo(t *testing.T) {
	t.Parallel()
	pg := testenv.OwnCluster(t)
	dbURL := pg.Database(t)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	natsPort, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	healthPort, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	health := fmt.Sprintf("http://127.0.0.1:%d", healthPort)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs testenv.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(binaries(t), "consumer"), "--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", natsPort),
		"--database-url", dbURL, "--health-addr", fmt.Sprintf("127.0.0.1:%d", healthPort), "--sandbox-listen", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--startup-wait", "2m")
	cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true")
	cmd.Stdout, cmd.Stderr = io.Discard, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		<-exited
	}()
	get := func(path string) (int, string) {
		resp, err := http.Get(health + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testenv.Eventually(t, 30*time.Second, "/readyz to say what the consumer waits for", func() bool {
		code, body := get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for NATS")
	})
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while waiting: %d", code)
	}
	// A container's healthcheck (the image has no shell) says not yet.
	if code, _, errOut := run(t, "consumer", "healthcheck", health+"/readyz"); code != cli.ExitUnavailable || !strings.Contains(errOut, "waiting for") {
		t.Fatalf("healthcheck while waiting: %d %s", code, errOut)
	}
	testenv.StartNATS(t, func(o *server.Options) { o.Port = natsPort })
	testenv.Eventually(t, 30*time.Second, "/readyz to wait for the ledger", func() bool {
		code, body := get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for the ledger")
	})
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the consumer to be ready", func() bool {
		code, _ := get("/readyz")
		return code == http.StatusOK
	})
	select {
	case err := <-exited:
		t.Fatalf("the consumer exited: %v\n%s", err, logs.String())
	default:
	}
	if code, _, errOut := run(t, "consumer", "healthcheck", health+"/readyz"); code != 0 {
		t.Fatalf("healthcheck once ready: %d %s", code, errOut)
	}
	if !strings.Contains(logs.String(), "waiting for NATS") || !strings.Contains(logs.String(), "waiting for the ledger") {
		t.Errorf("the log does not say what it waited for:\n%s", logs.String())
	}
	code, out, errOut := run(t, "publisher", "publish", "--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", natsPort), "--conversation", "late", "--turn", "1",
		"--tool", "send_payment", "--args", `{"invoice_id":"inv_late","amount_cents":100,"currency":"EUR"}`, "--wait", "--timeout", "30s")
	if code != 0 || !strings.Contains(out, `"status": "ok"`) {
		t.Fatalf("publish: %d\n%s\n%s\nconsumer:\n%s", code, out, errOut, logs.String())
	}
}

// TestJSONModePrintsOnlyJSON: with --log-format json the consumer prints
// nothing but JSON (what runs where is a log record), so a log pipeline can
// take its output whole.
func TestJSONModePrintsOnlyJSON(t *testing.T) {
	code, out, errOut := run(t, "consumer", "--log-format", "json", "--until-empty", "--data-dir", t.TempDir(),
		"--nats-listen", "127.0.0.1:0", "--sandbox-listen", "127.0.0.1:0")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	banner := false
	for _, stream := range []string{out, errOut} {
		for line := range strings.Lines(stream) {
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("a line that is not JSON: %q", line)
			}
			banner = banner || (rec["msg"] == "toolq consumer" && rec["nats"] != nil && rec["ledger"] != nil)
		}
	}
	if !banner {
		t.Fatalf("no record of what runs where:\n%s", errOut)
	}
}

// TestEveryFlagOfALongRunningCommandNamesItsVariable: every flag of the
// consumer and of the sandbox can be set from the environment, and --help
// says how.
func TestEveryFlagOfALongRunningCommandNamesItsVariable(t *testing.T) {
	for _, c := range [][]string{{"consumer", "run", "--help"}, {"sandbox", "--help"}} {
		code, out, errOut := run(t, c[0], c[1:]...)
		if code != 0 {
			t.Fatalf("%v: %d %s", c, code, errOut)
		}
		flags := 0
		for _, entry := range strings.Split(out, "\n  -")[1:] {
			flags++
			if !strings.Contains(entry, "(env ") {
				t.Errorf("%s: flag -%s names no environment variable", c[0], entry)
			}
		}
		if flags < 5 {
			t.Fatalf("%v: %d flags in\n%s", c, flags, out)
		}
	}
}

// TestMistakesAreExplained: the usual first mistakes get a message that
// names the fix, not a library's error.
func TestMistakesAreExplained(t *testing.T) {
	n := testenv.StartNATS(t) // a server on which no consumer created the streams
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"status", "--nats-url", "http://127.0.0.1:8222"}, cli.ExitUsage, "NATS speaks its own protocol, not HTTP: use nats://"},
		{[]string{"publish", "--nats-url", n.URL, "--conversation", "c", "--turn", "1", "--tool", "send_payment", "--args", "{}"}, cli.ExitUnavailable,
			"the streams are created by the first consumer that starts: start one (`consumer`)"},
	} {
		code, _, errOut := run(t, "publisher", c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("publisher %v: exit %d, %q; want %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}
}

// TestConfigurationReferenceIsWhatHelpSays: the flag tables of
// docs/configuration.md are what --help prints, flag for flag, and no
// other page of the documentation defines a flag of those commands again.
func TestConfigurationReferenceIsWhatHelpSays(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	entry := regexp.MustCompile(`(?s)\n  -(\S+)[^\n]*\n\s+(.*?)(?:\n  -|$)`)
	for _, c := range []struct{ marker, binary string }{{"consumer flags", "consumer"}, {"sandbox flags", "sandbox"}} {
		args := []string{"--help"}
		if c.binary == "consumer" {
			args = []string{"run", "--help"}
		}
		_, help, _ := run(t, c.binary, args...)
		_, flags, _ := strings.Cut(help, "flags:\n")
		var want []string
		for rest := "\n" + strings.TrimRight(flags, "\n"); ; {
			m := entry.FindStringSubmatchIndex(rest)
			if m == nil {
				break
			}
			name, usage := rest[m[2]:m[3]], strings.Join(strings.Fields(rest[m[4]:m[5]]), " ")
			env := regexp.MustCompile(` \(env (\w+)\)`).FindStringSubmatch(usage)
			usage = strings.Replace(usage, env[0], "", 1)
			def := ""
			if d := regexp.MustCompile(` \(default (.*)\)$`).FindStringSubmatch(usage); d != nil {
				def = "`" + strings.Trim(d[1], `"`) + "`"
				usage = strings.TrimSuffix(usage, d[0])
			}
			want = append(want, fmt.Sprintf("| `--%s` | `%s` | %s | %s |", name, env[1], def, usage))
			rest = rest[m[5]:]
		}
		_, section, _ := strings.Cut(string(doc), "<!-- "+c.marker)
		section, _, _ = strings.Cut(section, "<!-- end -->")
		var got []string
		for line := range strings.Lines(section) {
			if strings.HasPrefix(line, "| `--") {
				got = append(got, strings.TrimRight(line, "\n"))
			}
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("docs/configuration.md's %s are not what %s --help says; the table should read:\n%s", c.marker, c.binary, strings.Join(want, "\n"))
		}
		// Defined once: no other page has a table row for these flags.
		pages, _ := filepath.Glob("../../docs/*.md")
		for _, page := range append(pages, "../../README.md") {
			if filepath.Base(page) == "configuration.md" {
				continue
			}
			text, _ := os.ReadFile(page)
			for _, row := range want {
				flag, _, _ := strings.Cut(strings.TrimPrefix(row, "| "), " |")
				if strings.Contains(string(text), "| "+flag+" |") {
					t.Errorf("%s defines %s again", page, flag)
				}
			}
		}
	}
}

// TestConsumerWaitsForJetStreamNotJustTheSocket: a server of a JetStream
// cluster whose peers are not up yet (the usual order in Kubernetes) takes
// connections but answers no JetStream request. The consumer waits for
// JetStream itself, says so, and is not ready meanwhile; it exited within
// seconds, after saying ready.
func TestConsumerWaitsForJetStreamNotJustTheSocket(t *testing.T) {
	t.Parallel()
	p1, _ := testenv.FreePort()
	p2, _ := testenv.FreePort()
	cport, _ := testenv.FreePort()
	n := testenv.StartNATS(t, func(o *server.Options) {
		o.ServerName = "n1"
		o.Cluster = server.ClusterOpts{Name: "c", Host: "127.0.0.1", Port: cport}
		for _, p := range []int{p1, p2} {
			u, _ := url.Parse(fmt.Sprintf("nats-route://127.0.0.1:%d", p))
			o.Routes = append(o.Routes, u)
		}
	})
	healthPort, _ := testenv.FreePort()
	health := fmt.Sprintf("http://127.0.0.1:%d", healthPort)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs testenv.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(binaries(t), "consumer"), "--nats-url", n.URL, "--health-addr", fmt.Sprintf("127.0.0.1:%d", healthPort),
		"--sandbox-listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--startup-wait", "1m", "--replicas", "3")
	cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true")
	cmd.Stdout, cmd.Stderr = io.Discard, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		<-exited
	}()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the consumer exited (%v) inside its start-up wait:\n%s", err, logs.String())
		case <-deadline:
			if !strings.Contains(logs.String(), "waiting for JetStream") {
				t.Fatalf("the log does not say it waits for JetStream:\n%s", logs.String())
			}
			return
		case <-time.After(200 * time.Millisecond):
		}
		if resp, err := http.Get(health + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Fatal("/readyz said ready while JetStream has no leader")
			}
		}
	}
}

// TestSIGTERMDuringTheStartupWaitExitsZero: stopped while it waits for its
// dependencies, the consumer stops as it does after a drain: exit 0.
func TestSIGTERMDuringTheStartupWaitExitsZero(t *testing.T) {
	port, _ := testenv.FreePort()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs testenv.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(binaries(t), "consumer"), "--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", port),
		"--data-dir", t.TempDir(), "--startup-wait", "1m")
	cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true")
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the consumer to wait for NATS", func() bool { return strings.Contains(logs.String(), "waiting for NATS") })
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM while waiting: %v\n%s", err, logs.String())
	}
}

// TestPublishOfAnInvalidCallExitsRejectedOrUsage: a call that cannot run as
// given exits 4 (as publisher key does for it), a missing flag 2.
func TestPublishOfAnInvalidCallExitsRejectedOrUsage(t *testing.T) {
	nowhere := "nats://127.0.0.1:1"
	for _, c := range []struct {
		name string
		args []string
		want int
	}{
		{"a duplicate member", []string{"--tool", "t", "--args", `{"a":1,"a":2}`}, cli.ExitRejected},
		{"args not an object", []string{"--tool", "t", "--args", `[1]`}, cli.ExitRejected},
		{"a negative turn", []string{"--tool", "t", "--args", `{}`, "--turn", "-1"}, cli.ExitRejected},
		{"no tool", []string{"--args", `{}`}, cli.ExitUsage},
	} {
		args := append([]string{"publish", "--nats-url", nowhere, "--conversation", "c", "--turn", "1"}, c.args...)
		if code, _, errOut := run(t, "publisher", args...); code != c.want {
			t.Errorf("%s: exited %d, want %d (%s)", c.name, code, c.want, errOut)
		}
	}
}
