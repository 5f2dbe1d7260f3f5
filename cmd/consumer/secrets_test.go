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
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// The secrets the registry of TestPlantedSecretAppearsInNoSink takes, one
// from a file and one from the environment.
const (
	fileSecret = "tok-FILE-5ecret-b81f2"
	envSecret  = "api-ENV-5ecret-4c7d0"
)

// secretDownstream is the API the tools call: it records what it was sent,
// and answers by the call's mode: ok (200), echo (200, what it was sent in
// its answer, as an API that shows a request does), refuse (422), hang
// (until the call gives up).
type secretDownstream struct {
	mu    sync.Mutex
	auths []string
	paths []string
}

func (d *secretDownstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var args struct{ Mode string }
	json.NewDecoder(r.Body).Decode(&args)
	d.mu.Lock()
	d.auths, d.paths = append(d.auths, r.Header.Get("Authorization")), append(d.paths, r.URL.Path)
	d.mu.Unlock()
	switch args.Mode {
	case "echo":
		json.NewEncoder(w).Encode(map[string]any{"paid": true, "request": map[string]string{
			"authorization": r.Header.Get("Authorization"), "path": r.URL.Path}})
	case "refuse":
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprint(w, `{"error":"card declined"}`)
	case "hang":
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	default:
		fmt.Fprint(w, `{"paid":true}`)
	}
}

// TestPlantedSecretAppearsInNoSink runs a consumer whose tools send a token
// read from a file (${file:…}) in a header and one from the environment in
// their URL's path, through a success, a success whose answer echoes both
// secrets, a definite failure, a call left
// indeterminate (a timeout) and resolved by an operator, and a dead letter
// (a downstream that refuses connections, whose error quotes the URL); then
// the operator's commands (ledger ls, show, resolve; tools audit, export),
// the tool list and lookup services. The downstream gets both secrets;
// neither is in the consumer's logs, its spans, any column of any ledger
// table, any message of any stream (results, dead letters and their
// headers), its metrics, or any command's output.
//
// Not parallel: it installs the global tracer provider, which the worker
// and its HTTP tools take their tracers from.
func TestPlantedSecretAppearsInNoSink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rec := tracetest.NewSpanRecorder()
	// It stays installed (the global default delegates to the first one
	// set, for good): the package's other tests look at no spans.
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))

	down := &secretDownstream{}
	srv := httptest.NewServer(down)
	defer srv.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	offline := "http://" + l.Addr().String() // refuses connections
	l.Close()

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "payments_token")
	os.WriteFile(tokenFile, []byte(fileSecret+"\n"), 0o600)
	registry := filepath.Join(dir, "tools.yaml")
	os.WriteFile(registry, []byte(`tools:
  - name: pay
    class: keyed_write
    timeout: 2s
    schema: {type: object}
    http:
      url: ${BASE}/hooks/${API_KEY}/pay
      headers: {Authorization: "Bearer ${file:`+tokenFile+`}"}
  - name: notify
    class: unkeyed_write
    timeout: 1s
    schema: {type: object}
    http:
      url: ${BASE}/hooks/${API_KEY}/notify
      headers: {Authorization: "Bearer ${file:`+tokenFile+`}"}
  - name: pay_offline
    class: keyed_write
    timeout: 1s
    schema: {type: object}
    http:
      url: ${OFFLINE}/hooks/${API_KEY}/pay
      headers: {Authorization: "Bearer ${file:`+tokenFile+`}"}
`), 0o600)

	n := testenv.StartNATS(t)
	env := map[string]string{"BASE": srv.URL, "OFFLINE": offline, "API_KEY": envSecret,
		"NATS_URL": n.URL, "DATABASE_URL": testenv.Postgres(t), "TOOLQ_DATA_DIR": dir, "TOOLQ_TOOLS": registry}
	getenv := func(k string) string { return env[k] }

	var out, logs testenv.Buffer
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"--tools", registry, "--max-deliver", "3", "--log-level", "debug", "--health-addr", "127.0.0.1:0"},
			cli.IO{Out: &out, Err: &logs}, getenv)
	}()
	stopped := false
	stopConsumer := func() {
		if !stopped {
			stopped = true
			stop()
			if err := <-done; err != nil {
				t.Errorf("consumer: %v", err)
			}
		}
	}
	defer stopConsumer()
	var healthURL string
	testenv.Eventually(t, time.Minute, "the consumer to start", func() bool {
		healthURL = find(out.String(), `health\s+(http://[^/\s]+)`)
		return healthURL != ""
	})

	nc, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	client := jobs.NewClient(js)
	shown := map[string]string{} // what each sink holds, by where it is
	calls := []struct{ tool, id, mode string }{
		{"pay", "toolu_ok", "ok"},
		{"pay", "toolu_echo", "echo"},
		{"pay", "toolu_refused", "refuse"},
		{"notify", "toolu_timeout", "hang"},
		{"pay_offline", "toolu_offline", "ok"},
	}
	for _, c := range calls {
		j := &jobs.Job{ConversationID: "secrets", TurnIndex: 1, Tool: c.tool, ToolUseID: c.id, Args: json.RawMessage(`{"mode":"` + c.mode + `"}`)}
		if _, err := client.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	results := map[string]*jobs.Result{}
	for _, c := range calls[:len(calls)-1] { // a dead letter has no result
		r, err := client.Await(ctx, "secrets", c.id)
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.id, err, logs.String())
		}
		results[c.id] = r
		b, _ := json.Marshal(r)
		shown["result "+c.id] = string(b)
	}
	if results["toolu_ok"].Status != jobs.StatusOK || results["toolu_echo"].Status != jobs.StatusOK ||
		!strings.Contains(string(results["toolu_echo"].Output), "[redacted]") || results["toolu_refused"].Status == jobs.StatusOK ||
		results["toolu_timeout"].Status == jobs.StatusOK {
		t.Fatalf("results: %s", shown)
	}
	dlq, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the offline call's dead letter", func() bool {
		info, err := dlq.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})

	// The operator's view.
	command := func(args ...string) string {
		t.Helper()
		o, err := runConsumer(t, env, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		shown[strings.Join(args, " ")] = o
		return o
	}
	var rows []ledger.Row
	if err := json.Unmarshal([]byte(command("ledger", "ls", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	command("ledger", "ls")
	var indeterminate string
	for _, r := range rows {
		command("ledger", "show", r.Key)
		command("ledger", "show", r.Key, "--json")
		if r.State == ledger.Indeterminate {
			indeterminate = r.Key
		}
		l, err := client.Lookup(ctx, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(l)
		shown["lookup "+r.Key] = string(b)
	}
	if indeterminate == "" {
		t.Fatalf("no indeterminate call among %+v", rows)
	}
	command("ledger", "resolve", indeterminate, "--not-run", "--reason", "the notification never went out", "--by", "alice")
	command("ledger", "ls", "--json", "--limit", "100") // the resolve gave the call back: its row is gone, its history stays
	command("tools", "audit")
	command("tools", "audit", "--json")
	for _, f := range []string{"anthropic", "openai", "openai-responses", "mcp"} {
		command("tools", "export", "--format", f)
		list, err := client.Tools(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		shown["tool list "+f] = string(list)
	}
	resp, err := http.Get(healthURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	shown["metrics"] = string(metrics)

	stopConsumer() // its last logs and spans
	shown["consumer output"] = out.String()
	shown["consumer logs"] = logs.String()
	for i, s := range rec.Ended() {
		shown[fmt.Sprintf("span %d %s", i, s.Name())] = spanText(s)
	}
	if len(rec.Ended()) == 0 {
		t.Fatal("no spans")
	}
	for table, text := range ledgerTables(t, env["DATABASE_URL"]) {
		shown["ledger table "+table] = text
	}
	for name, text := range streamMessages(t, js) {
		shown["stream "+name] = text
	}
	for where, want := range map[string]string{"stream " + jobs.DLQStream: "pay_offline", "ledger table toolq_ledger": "alice"} {
		if !strings.Contains(shown[where], want) { // the dead letter; the resolve's audit trail
			t.Errorf("%s: no %q in %q", where, want, shown[where])
		}
	}

	for where, text := range shown {
		for _, secret := range []string{fileSecret, envSecret} {
			if i := strings.Index(text, secret); i >= 0 {
				t.Errorf("%s shows a secret: …%s…", where, text[max(0, i-200):min(len(text), i+len(secret)+50)])
			}
		}
	}
	// The downstream was given both, on every call it got.
	down.mu.Lock()
	defer down.mu.Unlock()
	if len(down.auths) < 3 {
		t.Fatalf("the downstream got %d calls", len(down.auths))
	}
	for i := range down.auths {
		if down.auths[i] != "Bearer "+fileSecret || !strings.Contains(down.paths[i], "/hooks/"+envSecret+"/") {
			t.Errorf("the downstream got %q at %q", down.auths[i], down.paths[i])
		}
	}
	// And what would have shown them says where they were.
	if !strings.Contains(shown["consumer logs"], "[redacted]") {
		t.Errorf("the logs never say a secret was redacted:\n%s", shown["consumer logs"])
	}
}

// spanText is everything a span records, as text.
func spanText(s sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	fmt.Fprintln(&b, s.Name(), s.Status().Description)
	for _, kv := range s.Attributes() {
		fmt.Fprintln(&b, kv.Key, kv.Value.String())
	}
	for _, ev := range s.Events() {
		fmt.Fprintln(&b, ev.Name)
		for _, kv := range ev.Attributes {
			fmt.Fprintln(&b, kv.Key, kv.Value.String())
		}
	}
	for _, l := range s.Links() {
		for _, kv := range l.Attributes {
			fmt.Fprintln(&b, kv.Key, kv.Value.String())
		}
	}
	for _, kv := range s.Resource().Attributes() {
		fmt.Fprintln(&b, kv.Key, kv.Value.String())
	}
	return b.String()
}

// ledgerTables is every row of every table of the ledger's database, each
// as JSON, by table.
func ledgerTables(t *testing.T, url string) map[string]string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rs, err := conn.Query(ctx, `SELECT quote_ident(table_schema) || '.' || quote_ident(table_name), table_name FROM information_schema.tables
		WHERE table_schema NOT IN ('pg_catalog', 'information_schema') AND table_type = 'BASE TABLE'`)
	if err != nil {
		t.Fatal(err)
	}
	var tables [][2]string
	for rs.Next() {
		var q, name string
		rs.Scan(&q, &name)
		tables = append(tables, [2]string{q, name})
	}
	if rs.Err() != nil || len(tables) == 0 {
		t.Fatalf("tables: %v %v", tables, rs.Err())
	}
	out := map[string]string{}
	for _, tb := range tables {
		var text *string
		if err := conn.QueryRow(ctx, "SELECT string_agg(row_to_json(t)::text, E'\\n') FROM "+tb[0]+" t").Scan(&text); err != nil {
			t.Fatalf("%s: %v", tb[0], err)
		}
		if text != nil {
			out[tb[1]] = *text
		}
	}
	return out
}

// streamMessages is every message of every stream, headers and data, by
// stream.
func streamMessages(t *testing.T, js jetstream.JetStream) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue // deleted
			}
			fmt.Fprintf(&b, "%s %v %s\n", m.Subject, m.Header, m.Data)
		}
		out[name] = b.String()
	}
	if names.Err() != nil {
		t.Fatal(names.Err())
	}
	return out
}
