package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/demo"
	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/internal/version"
	"github.com/toolq/toolq/jobs"
)

// TestEmbeddedDefault runs the consumer as a newcomer would, with nothing but
// a data directory: embedded NATS, SQLite ledger, demo tools and sandbox.
// The same call published twice pays once and answers twice.
func TestEmbeddedDefault(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var out, logs testenv.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--data-dir", dir, "--nats-listen", "127.0.0.1:0", "--sandbox-listen", "127.0.0.1:0",
			"--health-addr", "127.0.0.1:0"}, cli.IO{Out: &out, Err: &logs}, func(string) string { return "" })
	}()
	var natsURL, sandboxURL, healthURL string
	defer func() {
		if natsURL == "" || sandboxURL == "" || healthURL == "" {
			cancel()
			t.Logf("no banner:\n%s\n%s", out.String(), logs.String())
		}
	}()
	testenv.Eventually(t, 60*time.Second, "the banner", func() bool {
		banner := out.String()
		natsURL = find(banner, `embedded, (nats://\S+)`)
		sandboxURL = find(banner, `sandbox\s+(http://\S+)`)
		healthURL = find(banner, `health\s+(http://[^/\s]+)`)
		return natsURL != "" && sandboxURL != "" && healthURL != ""
	})
	if !strings.Contains(out.String(), "sqlite "+dir) || !strings.Contains(out.String(), "publisher publish") {
		t.Fatalf("banner:\n%s", out.String())
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	client := jobs.NewClient(js)
	args := json.RawMessage(`{"invoice_id":"inv_42","amount_cents":1500,"currency":"EUR"}`)
	var results []*jobs.Result
	for _, id := range []string{"toolu_first", "toolu_retry"} {
		j := &jobs.Job{ConversationID: "demo", TurnIndex: 1, Tool: "send_payment", ToolUseID: id, Args: args}
		if _, err := client.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		r, err := client.Await(wctx, "demo", id)
		wcancel()
		if err != nil {
			t.Fatalf("%v\n%s", err, logs.String())
		}
		results = append(results, r)
	}
	if results[0].Status != jobs.StatusOK || results[0].Duplicate || !results[1].Duplicate || string(results[0].Output) != string(results[1].Output) {
		t.Fatalf("results %+v %+v", results[0], results[1])
	}
	resp, err := http.Get(sandboxURL + "/v1/payments")
	if err != nil {
		t.Fatal(err)
	}
	var payments struct{ Data []sandbox.Payment }
	json.NewDecoder(resp.Body).Decode(&payments)
	resp.Body.Close()
	if len(payments.Data) != 1 {
		t.Fatalf("%d payments", len(payments.Data))
	}
	for path, want := range map[string]string{"/healthz": "ok " + version.Get().String(), "/readyz": "ready", "/metrics": `toolq_duplicates_suppressed_total{`} {
		resp, err := http.Get(healthURL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d %q", path, resp.StatusCode, body)
		}
	}
	if resp, err := http.Get(healthURL + "/debug/pprof/"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --debug-pprof: %v %v, want 404", resp, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consumer: %v", err)
	}
	if _, err := os.Stat(dir + "/ledger.db"); err != nil {
		t.Fatal(err)
	}
}

func find(s, pattern string) string {
	m := regexp.MustCompile(pattern).FindStringSubmatch(s)
	if m == nil {
		return ""
	}
	return m[1]
}

func TestPortTakenSaysWhichFlag(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = runConsumer(t, nil, "--data-dir", t.TempDir(), "--nats-listen", l.Addr().String())
	if err == nil || !strings.Contains(err.Error(), l.Addr().String()) || !strings.Contains(err.Error(), "--nats-listen") {
		t.Fatalf("err = %v", err)
	}
	_, err = runConsumer(t, nil, "--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--sandbox-listen", l.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "--sandbox-listen") {
		t.Fatalf("err = %v", err)
	}
}

// TestUntilEmpty: with jobs waiting, `consumer --until-empty` processes them
// against Postgres and a tools file, then exits 0.
func TestUntilEmpty(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	ctx := context.Background()
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	sb, _ := sandbox.New(sandbox.Config{})
	srv := httptest.NewServer(sb)
	defer srv.Close()
	toolsFile := t.TempDir() + "/tools.yaml"
	os.WriteFile(toolsFile, demo.ToolsYAML, 0o600)
	client := jobs.NewClient(js)
	for i := range 3 {
		j := &jobs.Job{ConversationID: "batch", Tool: "send_payment", ToolUseID: fmt.Sprintf("toolu_%d", i),
			Args: json.RawMessage(fmt.Sprintf(`{"invoice_id":"inv_%d","amount_cents":100,"currency":"EUR"}`, i))}
		if _, err := client.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{"DATABASE_URL": testenv.Postgres(t), "NATS_URL": n.URL, "TOOLQ_SANDBOX_URL": srv.URL}
	if _, err := runConsumer(t, env, "--tools", toolsFile, "--until-empty"); err != nil {
		t.Fatal(err)
	}
	if got := len(sb.Payments()); got != 3 {
		t.Fatalf("%d payments", got)
	}
	for i := range 3 {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := client.Await(wctx, "batch", fmt.Sprintf("toolu_%d", i))
		cancel()
		if err != nil || r.Status != jobs.StatusOK {
			t.Fatalf("result %d: %+v %v", i, r, err)
		}
	}
}

// TestDebugPprof: --debug-pprof serves Go's profiles next to the health
// endpoints, for an operator chasing memory or CPU in a running consumer.
func TestDebugPprof(t *testing.T) {
	t.Parallel()
	addr, stop, err := serveHealth("127.0.0.1:0", &readiness{}, http.NotFoundHandler(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for path, want := range map[string]string{"/debug/pprof/": "heap", "/debug/pprof/goroutine?debug=1": "goroutine profile: total", "/debug/vars": `"Mallocs":`} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d %.200q", path, resp.StatusCode, body)
		}
	}
}
