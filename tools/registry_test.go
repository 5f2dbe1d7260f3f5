package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/toolq/toolq/demo"
	"github.com/toolq/toolq/tools"
)

func TestDemoRegistry(t *testing.T) {
	t.Parallel()
	reg, err := demo.Registry("http://127.0.0.1:1", tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		class  tools.Class
		ledger bool
	}{
		"send_payment":  {tools.KeyedWrite, true},
		"create_ticket": {tools.UnkeyedWrite, true},
		"search_orders": {tools.Read, false},
	}
	if len(reg.Tools()) != len(want) {
		t.Fatalf("%d tools", len(reg.Tools()))
	}
	for _, tool := range reg.Tools() {
		w := want[tool.Name]
		if tool.Class != w.class || tool.UsesLedger != w.ledger || tool.Lease <= tool.Timeout || tool.Downstream != "http://127.0.0.1:1" {
			t.Errorf("%s: %+v", tool.Name, tool)
		}
	}
	// The file also loads on its own, reading TOOLQ_SANDBOX_URL.
	path := filepath.Join("..", "demo", "tools.yaml")
	reg, err = tools.Load(path, tools.Config{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if tool, _ := reg.Lookup("send_payment"); tool.Downstream != "http://127.0.0.1:8089" {
		t.Fatalf("default TOOLQ_SANDBOX_URL: %s", tool.Downstream)
	}
}

// TestBadArgsNeverReachTheExecutor: the demo schemas reject a corpus of bad
// args with the schema's reason, so that a caller that validates before Run
// (as the worker does) sends the downstream no request.
func TestBadArgsNeverReachTheExecutor(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1); fmt.Fprint(w, `{}`) }))
	defer srv.Close()
	reg, err := demo.Registry(srv.URL, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pay, _ := reg.Lookup("send_payment")
	ticket, _ := reg.Lookup("create_ticket")
	search, _ := reg.Lookup("search_orders")
	for _, tc := range []struct {
		name   string
		tool   *tools.Tool
		args   string
		reason string
	}{
		{"amount a string", pay, `{"invoice_id":"i","amount_cents":"100","currency":"EUR"}`, "/amount_cents"},
		{"amount a float", pay, `{"invoice_id":"i","amount_cents":1.5,"currency":"EUR"}`, "/amount_cents"},
		{"amount zero", pay, `{"invoice_id":"i","amount_cents":0,"currency":"EUR"}`, "/amount_cents"},
		{"amount out of range", pay, `{"invoice_id":"i","amount_cents":1e15,"currency":"EUR"}`, "/amount_cents"},
		{"amount beyond 2^53", pay, `{"invoice_id":"i","amount_cents":9007199254740993,"currency":"EUR"}`, "2^53"},
		{"lowercase currency", pay, `{"invoice_id":"i","amount_cents":1,"currency":"eur"}`, "/currency"},
		{"extra member", pay, `{"invoice_id":"i","amount_cents":1,"currency":"EUR","to":"attacker"}`, "to"},
		{"missing member", pay, `{"invoice_id":"i","amount_cents":1}`, "currency"},
		{"not an object", pay, `[1]`, "object"},
		{"duplicate member", pay, `{"invoice_id":"i","invoice_id":"j","amount_cents":1,"currency":"EUR"}`, "duplicate"},
		{"1 MB string", ticket, `{"title":"t","body":"` + strings.Repeat("x", 1<<20) + `"}`, "/body"},
		{"title a number", ticket, `{"title":1,"body":""}`, "/title"},
		{"deep nesting", ticket, `{"title":"t","body":` + strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat(`}`, 100) + `}`, "nesting"},
		{"nested object where a string goes", ticket, `{"title":"t","body":{"a":{"b":1}}}`, "/body"},
		{"null query", search, `{"query":null}`, "/query"},
	} {
		err := tc.tool.Validate(json.RawMessage(tc.args))
		if err == nil {
			tc.tool.Run(context.Background(), tools.Request{Tool: tc.tool.Name, Key: "k", Args: json.RawMessage(tc.args)})
		}
		if !errors.Is(err, tools.ErrInvalidArgs) {
			t.Errorf("%s: err = %v", tc.name, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.reason) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: reason %q does not name %q in one line", tc.name, err, tc.reason)
		}
	}
	if hits.Load() != 0 {
		t.Fatalf("%d requests reached the downstream", hits.Load())
	}
	if _, err := pay.Run(context.Background(), tools.Request{Key: "k", Args: json.RawMessage(`{"invoice_id":"i","amount_cents":1,"currency":"EUR"}`)}); err != nil || hits.Load() != 1 {
		t.Fatalf("valid args: %v, %d hits", err, hits.Load())
	}
}

func TestLoadErrorsNameFileToolAndField(t *testing.T) {
	t.Parallel()
	const good = `
  - name: ok
    class: read
    schema: {type: object}
    builtin: echo
`
	echo := map[string]tools.Executor{"echo": tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) { return r.Args, nil })}
	env := func(k string) string { return map[string]string{"SET": "http://h"}[k] }
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown class", `
  - name: pay
    class: keyed-write
    schema: {type: object}
    builtin: echo`, []string{`tool "pay"`, "class", "keyed-write"}},
		{"duplicate name", good + good, []string{`tool "ok"`, "name", "twice"}},
		{"badly formed name", `
  - name: "pay now"
    class: read
    schema: {type: object}
    builtin: echo`, []string{`tool "pay now"`, "name"}},
		{"invalid schema", `
  - name: pay
    class: read
    schema: {type: 12}
    builtin: echo`, []string{`tool "pay"`, "schema"}},
		{"missing schema", `
  - name: pay
    class: read
    builtin: echo`, []string{`tool "pay"`, "schema", "missing"}},
		{"lease not above timeout", `
  - name: pay
    class: keyed_write
    timeout: 10s
    lease: 10s
    schema: {type: object}
    builtin: echo`, []string{`tool "pay"`, "lease", "exceed"}},
		{"unset environment variable", `
  - name: pay
    class: keyed_write
    schema: {type: object}
    http: {url: "${UNSET_VAR}/v1/payments"}`, []string{`tool "pay"`, "http.url", "UNSET_VAR"}},
		{"unset secret in a header", `
  - name: pay
    class: keyed_write
    schema: {type: object}
    http: {url: "${SET}/v1", headers: {Authorization: "Bearer ${PAY_TOKEN}"}}`, []string{`tool "pay"`, "http.headers.Authorization", "PAY_TOKEN"}},
		{"unknown field", `
  - name: pay
    klass: read`, []string{"klass"}},
		{"two executors", `
  - name: pay
    class: read
    schema: {type: object}
    builtin: echo
    http: {url: "http://h/x"}`, []string{`tool "pay"`, "one executor"}},
		{"unknown builtin", `
  - name: pay
    class: read
    schema: {type: object}
    builtin: nope`, []string{`tool "pay"`, "builtin", "nope"}},
		{"unkeyed write without ledger", `
  - name: t
    class: unkeyed_write
    ledger: false
    schema: {type: object}
    builtin: echo`, []string{`tool "t"`, "ledger"}},
		{"breakers disagree on a downstream", `
  - name: a
    class: read
    schema: {type: object}
    http: {url: "http://h/a"}
  - name: b
    class: read
    schema: {type: object}
    breaker: {failures: 9}
    http: {url: "http://h/b"}`, []string{`tool "b"`, "breaker", `"a"`}},
		{"bad retention", `
  - name: pay
    class: read
    retention: 30 days
    schema: {type: object}
    builtin: echo`, []string{`tool "pay"`, "retention"}},
		{"bad duration", `
  - name: pay
    class: read
    timeout: soon
    schema: {type: object}
    builtin: echo`, []string{`tool "pay"`, "timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "tools.yaml")
			if err := os.WriteFile(path, []byte("tools:"+tc.yaml+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := tools.Load(path, tools.Config{Builtins: echo, Getenv: env})
			if err == nil {
				t.Fatal("loaded")
			}
			msg := err.Error()
			for _, w := range append(tc.want, path) {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error is not one line: %q", msg)
			}
		})
	}
	// The same file without the fault loads, and the lease defaults above the timeout.
	reg, err := tools.Parse([]byte("tools:"+good), "x.yaml", tools.Config{Builtins: echo})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("ok")
	if tool.Timeout != tools.DefaultTimeout || tool.Lease <= tool.Timeout || tool.Concurrency != tools.DefaultConcurrency || tool.Retention != 0 {
		t.Fatalf("defaults: %+v", tool)
	}
}

// TestRetention: a tool's retention is its own or the file's default, read
// by Parse and, without the executors' environment, by LoadRetention.
func TestRetention(t *testing.T) {
	t.Parallel()
	const file = `retention: 31d
tools:
  - name: pay
    class: keyed_write
    retention: 90d
    schema: {type: object}
    http: {url: "${PAY_URL}/v1"}
  - name: ticket
    class: unkeyed_write
    schema: {type: object}
    http: {url: "${PAY_URL}/v2"}
`
	reg, err := tools.Parse([]byte(file), "tools.yaml", tools.Config{Getenv: func(string) string { return "http://h" }})
	if err != nil {
		t.Fatal(err)
	}
	pay, _ := reg.Lookup("pay")
	ticket, _ := reg.Lookup("ticket")
	const day = 24 * time.Hour
	if pay.Retention != 90*day || ticket.Retention != 31*day {
		t.Fatalf("retention: pay %s, ticket %s", pay.Retention, ticket.Retention)
	}
	path := filepath.Join(t.TempDir(), "tools.yaml")
	os.WriteFile(path, []byte(file), 0o600)
	r, err := tools.LoadRetention(path) // PAY_URL is not set: only the retentions are read
	if err != nil || r.Default != 31*day || r.Of("pay") != 90*day || r.Of("ticket") != 31*day || r.Of("other") != 31*day {
		t.Fatalf("LoadRetention: %+v %v", r, err)
	}
	os.WriteFile(path, []byte("retention: 1 month\ntools: []\n"), 0o600)
	if _, err := tools.LoadRetention(path); err == nil || !strings.Contains(err.Error(), "retention") {
		t.Fatalf("a bad retention: %v", err)
	}
}

func TestConcurrencyLimit(t *testing.T) {
	t.Parallel()
	var running, peak atomic.Int32
	slow := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		running.Add(-1)
		return json.RawMessage(`{}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "slow", Class: tools.Read, Schema: json.RawMessage(anySchema), Executor: slow, Concurrency: 2}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("slow")
	done := make(chan struct{})
	for range 8 {
		go func() {
			tool.Run(context.Background(), tools.Request{Args: json.RawMessage(`{}`)})
			done <- struct{}{}
		}()
	}
	for range 8 {
		<-done
	}
	if peak.Load() != 2 {
		t.Fatalf("peak concurrency %d, want 2", peak.Load())
	}
}

// TestBeforeSendDecidesWhileTheCallHoldsItsSlot pins BeforeSend: the check
// runs once the call holds a slot (never while another call has it), and a
// check that says no stops the call before the executor, as NotSent.
func TestBeforeSendDecidesWhileTheCallHoldsItsSlot(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	gate := make(chan struct{})
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		calls.Add(1)
		<-gate
		return json.RawMessage(`{}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "one", Class: tools.Read, Schema: json.RawMessage(anySchema), Executor: exec, Concurrency: 1}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("one")
	first := make(chan error, 1)
	go func() {
		_, err := tool.Run(context.Background(), tools.Request{Args: json.RawMessage(`{}`)})
		first <- err
	}()
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	lost := errors.New("the claim is another's")
	checked := make(chan struct{})
	second := make(chan error, 1)
	go func() {
		_, err := tool.Run(context.Background(), tools.Request{Args: json.RawMessage(`{}`)}, tools.BeforeSend(func(context.Context) error {
			close(checked)
			return lost
		}))
		second <- err
	}()
	select {
	case <-checked:
		t.Fatal("BeforeSend ran while the only slot was held by another call")
	case <-time.After(50 * time.Millisecond):
	}
	close(gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	err = <-second
	outcome, te := tools.Classify(err)
	if outcome != tools.NotSent || te.Code != tools.CodeNotStarted || !errors.Is(err, lost) {
		t.Fatalf("a call stopped by BeforeSend gave %v %v, want NotSent %s wrapping the check's error", outcome, err, tools.CodeNotStarted)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the executor ran %d times, want 1 (the stopped call never runs)", n)
	}
}

// TestRunGivesValidUTF8: whatever bytes a built-in executor returns, the
// output and the error message that Run gives back are valid UTF-8 (the
// ledger and the results stream store them as text; Postgres refuses
// anything else, and would fail the whole group commit).
func TestRunGivesValidUTF8(t *testing.T) {
	t.Parallel()
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		if r.ToolUseID == "fail" {
			return nil, tools.DefiniteError("declined", "caf\xe9 declined")
		}
		return json.RawMessage("{\"name\":\"caf\xe9\"}"), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "t", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("t")
	out, err := tool.Run(context.Background(), tools.Request{Tool: "t", Args: json.RawMessage(`{}`)})
	if err != nil || !utf8.Valid(out) || !json.Valid(out) || string(out) != "{\"name\":\"caf\uFFFD\"}" {
		t.Fatalf("output %q %v", out, err)
	}
	_, err = tool.Run(context.Background(), tools.Request{Tool: "t", ToolUseID: "fail", Args: json.RawMessage(`{}`)})
	outcome, te := tools.Classify(err)
	if outcome != tools.Definite || te.Code != "declined" || !utf8.ValidString(te.Message) {
		t.Fatalf("error %v %+v", outcome, te)
	}
}

// TestUnknownFieldSaysWhatItMeant: a misspelled field of a registry file
// is refused with its line and the field it most likely meant.
func TestUnknownFieldSaysWhatItMeant(t *testing.T) {
	t.Parallel()
	for data, want := range map[string]string{
		"tools:\n  - name: x\n    class: read\n    timout: 5s\n    http: {method: GET, url: \"http://a/b\"}\n":                    `line 4: unknown field "timout" (did you mean "timeout"?)`,
		"tools:\n  - name: x\n    class: keyed_write\n    breaker: {failure: 3}\n    http: {method: POST, url: \"http://a/b\"}\n": `line 4: unknown field "failure" (did you mean "failures"?)`,
		"tools:\n  - name: x\n    class: read\n    http: {method: GET, url: \"http://a/b\", idempotency_headr: X}\n":              `unknown field "idempotency_headr" (did you mean "idempotency_header"?)`,
		"tool:\n  - name: x\n":                   `line 1: unknown field "tool" (did you mean "tools"?)`,
		"tools:\n  - name: x\n    zzzzzzzz: 1\n": `unknown field "zzzzzzzz" (known: name, description, class`,
	} {
		_, err := tools.Parse([]byte(data), "reg.yaml", tools.Config{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %s", data, err, want)
		}
	}
}
