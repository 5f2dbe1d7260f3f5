package tools_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/tools"
)

// mcpSandbox is the demo payments server's MCP endpoint over HTTP.
func mcpSandbox(t *testing.T, faults sandbox.Faults) (*sandbox.Server, string) {
	t.Helper()
	sb, err := sandbox.New(sandbox.Config{Faults: faults})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sb)
	t.Cleanup(srv.Close)
	return sb, srv.URL + "/mcp"
}

// mcpTool registers one MCP tool of the given class.
func mcpTool(t *testing.T, class tools.Class, m tools.MCP, timeout time.Duration) *tools.Tool {
	t.Helper()
	exec, err := tools.MCPExecutor(m)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "t", Class: class, Schema: json.RawMessage(anySchema),
		Executor: exec, Downstream: exec.Downstream(), Timeout: timeout, Breaker: tools.Breaker{Failures: 1000}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	tool, _ := reg.Lookup("t")
	return tool
}

func callKeyed(t *testing.T, tool *tools.Tool, key, args string) (json.RawMessage, tools.Outcome, *tools.Error) {
	t.Helper()
	out, err := tool.Run(context.Background(), tools.Request{Tool: tool.Name, Key: key, Args: json.RawMessage(args), ToolUseID: "toolu_1"})
	outcome, te := tools.Classify(err)
	return out, outcome, te
}

const payArgs = `{"amount_cents":500,"currency":"EUR","invoice_id":"inv_1"}`

func TestMCPCallCarriesTheKeyInMetaAndHeaderAndARepeatIsCollapsed(t *testing.T) {
	t.Parallel()
	sb, url := mcpSandbox(t, sandbox.Faults{})
	var headers sync.Map
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if v := r.Header.Get("Idempotency-Key"); v != "" {
			headers.Store(v, true)
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	tool := mcpTool(t, tools.KeyedWrite, tools.MCP{URL: url, Tool: "send_payment", Client: client}, 5*time.Second)
	first, outcome, te := callKeyed(t, tool, "key_1", payArgs)
	if outcome != tools.Success {
		t.Fatalf("outcome %v: %v", outcome, te)
	}
	var out map[string]any
	if err := json.Unmarshal(first, &out); err != nil || out["status"] != "succeeded" || out["amount_cents"] != 500.0 {
		t.Fatalf("output is not the payment's structured content: %s", first)
	}
	again, outcome, _ := callKeyed(t, tool, "key_1", payArgs)
	if outcome != tools.Success || string(again) != string(first) {
		t.Fatalf("the repeat answered %v %s, want the first answer %s", outcome, again, first)
	}
	if ps := sb.Payments(); len(ps) != 1 || ps[0].IdempotencyKey != "key_1" {
		t.Fatalf("payments %+v: want one, under key_1", ps)
	}
	if _, ok := headers.Load(strconv.Quote("key_1")); !ok {
		t.Error("the key was not sent in the Idempotency-Key header as a structured-field string")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestMCPOutcomesAreClassifiedLikeTheHTTPExecutors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		faults   sandbox.Faults
		tool     string
		args     string
		want     tools.Outcome
		code     string
		payments int
	}{
		{"a result with isError is definite", sandbox.Faults{ErrorRate: 1}, "send_payment", payArgs, tools.Definite, "mcp_tool_error", 0},
		{"args the server refuses are definite", sandbox.Faults{}, "send_payment", `{"invoice_id":"x"}`, tools.Definite, "mcp_tool_error", 0},
		{"an unknown tool is a definite JSON-RPC error", sandbox.Faults{}, "no_such_tool", payArgs, tools.Definite, "jsonrpc_-32602", 0},
		{"a JSON-RPC internal error may have acted", sandbox.Faults{ServerErrorRate: 1}, "send_payment", payArgs, tools.Ambiguous, "jsonrpc_-32603", 0},
		{"a stream cut after the effect is ambiguous", sandbox.Faults{DropAfterEffectRate: 1}, "send_payment", payArgs, tools.Ambiguous, "connection_lost", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sb, url := mcpSandbox(t, tc.faults)
			tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url, Tool: tc.tool}, 5*time.Second)
			_, outcome, te := callKeyed(t, tool, "key_c", tc.args)
			if outcome != tc.want || te == nil || te.Code != tc.code {
				t.Fatalf("got %v %+v, want %v with code %s", outcome, te, tc.want, tc.code)
			}
			if n := len(sb.Payments()); n != tc.payments {
				t.Fatalf("%d payments, want %d", n, tc.payments)
			}
		})
	}
}

func TestMCPServerThatRefusesTheConnectionIsNotSent(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: "http://" + addr + "/mcp", Tool: "send_payment"}, 5*time.Second)
	_, outcome, te := callKeyed(t, tool, "key_r", payArgs)
	if outcome != tools.NotSent {
		t.Fatalf("got %v %+v, want not sent", outcome, te)
	}
}

func TestMCPCallThatOutlivesItsTimeoutAfterBeingSentIsAmbiguous(t *testing.T) {
	t.Parallel()
	sb, url := mcpSandbox(t, sandbox.Faults{LatencyMS: 3000})
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url, Tool: "create_ticket"}, 500*time.Millisecond)
	_, outcome, te := callKeyed(t, tool, "key_t", `{"title":"slow"}`)
	if outcome != tools.Ambiguous {
		t.Fatalf("got %v %+v, want ambiguous", outcome, te)
	}
	testenv.Eventually(t, 10*time.Second, "the slow ticket is made", func() bool { return len(sb.Tickets()) == 1 })
}

func TestMCPSessionTheServerForgotIsReplacedWithoutSendingTheCallTwice(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "state.json")
	var current atomic.Pointer[sandbox.Server]
	restart := func() {
		sb, err := sandbox.New(sandbox.Config{StatePath: state})
		if err != nil {
			t.Fatal(err)
		}
		current.Store(sb)
	}
	restart()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { current.Load().ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: srv.URL + "/mcp", Tool: "create_ticket"}, 5*time.Second)
	if _, outcome, te := callKeyed(t, tool, "key_1", `{"title":"one"}`); outcome != tools.Success {
		t.Fatalf("first call: %v %+v", outcome, te)
	}
	// The server restarts (same effects, no sessions): the pooled session
	// is unknown to it now, and it answers 404.
	restart()
	if _, outcome, te := callKeyed(t, tool, "key_2", `{"title":"two"}`); outcome != tools.Success {
		t.Fatalf("call after the restart: %v %+v", outcome, te)
	}
	if _, tickets := stateOf(t, state); tickets != 2 {
		t.Fatalf("%d tickets, want 2: each call once", tickets)
	}
}

func TestMCPConcurrentCallsEachTakeOneSession(t *testing.T) {
	t.Parallel()
	sb, url := mcpSandbox(t, sandbox.Faults{LatencyMS: 50})
	tool := mcpTool(t, tools.KeyedWrite, tools.MCP{URL: url, Tool: "send_payment"}, 10*time.Second)
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			args := `{"amount_cents":100,"currency":"EUR","invoice_id":"inv_` + strconv.Itoa(i) + `"}`
			if _, outcome, te := callKeyed(t, tool, "key_"+strconv.Itoa(i), args); outcome != tools.Success {
				t.Errorf("call %d: %v %+v", i, outcome, te)
			}
		})
	}
	wg.Wait()
	if n := len(sb.Payments()); n != 24 {
		t.Fatalf("%d payments, want 24", n)
	}
}

// sandboxBinary builds cmd/sandbox once per test binary.
var sandboxBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "toolq-sandbox-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "sandbox")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/toolq/toolq/cmd/sandbox").CombinedOutput()
	if err != nil {
		return "", &buildError{string(out)}
	}
	return bin, nil
})

type buildError struct{ out string }

func (e *buildError) Error() string { return "go build ./cmd/sandbox: " + e.out }

// stdioSandbox is the sandbox as a stdio MCP server: a command that starts
// it with its effects persisted in state, writing its pid to pidFile.
func stdioSandbox(t *testing.T, extra ...string) (command []string, state, pidFile string) {
	t.Helper()
	bin, err := sandboxBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	state, pidFile = filepath.Join(dir, "state.json"), filepath.Join(dir, "pid")
	script := `echo $$ > "$1"; shift; exec "$@"`
	command = append([]string{"sh", "-c", script, "sh", pidFile, bin, "--mcp-stdio", "--state", state}, extra...)
	return command, state, pidFile
}

// stateOf reads the effects a sandbox persisted.
func stateOf(t *testing.T, path string) (payments, tickets int) {
	t.Helper()
	sb, err := sandbox.New(sandbox.Config{StatePath: path})
	if err != nil {
		t.Fatal(err)
	}
	return len(sb.Payments()), len(sb.Tickets())
}

func TestMCPStdioServerRunsCallsAndARepeatedKeyIsCollapsed(t *testing.T) {
	t.Parallel()
	command, state, _ := stdioSandbox(t)
	tool := mcpTool(t, tools.KeyedWrite, tools.MCP{Command: command, Tool: "send_payment"}, 10*time.Second)
	first, outcome, te := callKeyed(t, tool, "key_s", payArgs)
	if outcome != tools.Success {
		t.Fatalf("%v %+v", outcome, te)
	}
	again, outcome, _ := callKeyed(t, tool, "key_s", payArgs)
	if outcome != tools.Success || string(again) != string(first) {
		t.Fatalf("repeat: %v %s, want %s", outcome, again, first)
	}
	if p, _ := stateOf(t, state); p != 1 {
		t.Fatalf("%d payments, want 1", p)
	}
}

func TestMCPStdioServerKilledMidCallIsAmbiguousAndTheNextCallStartsItAgain(t *testing.T) {
	t.Parallel()
	command, state, pidFile := stdioSandbox(t, "--latency", "5s")
	tool := mcpTool(t, tools.KeyedWrite, tools.MCP{Command: command, Tool: "send_payment"}, 20*time.Second)
	done := make(chan struct{})
	var outcome tools.Outcome
	var te *tools.Error
	go func() {
		defer close(done)
		_, outcome, te = callKeyed(t, tool, "key_k", payArgs)
	}()
	var pid int
	testenv.Eventually(t, 10*time.Second, "the stdio server started", func() bool {
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	time.Sleep(500 * time.Millisecond) // the call is written and waits out the server's latency
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done
	if outcome != tools.Ambiguous {
		t.Fatalf("a server killed mid-call gave %v %+v, want ambiguous", outcome, te)
	}
	os.Remove(pidFile)
	// Retried with the same key (what a keyed write does), on a new server.
	if _, outcome, te := callKeyed(t, tool, "key_k", payArgs); outcome != tools.Success {
		t.Fatalf("the retry: %v %+v", outcome, te)
	}
	if p, _ := stateOf(t, state); p != 1 {
		t.Fatalf("%d payments, want 1", p)
	}
}

func TestMCPStdioServerThatDiesAfterTheEffectLeavesAnUnkeyedWriteAmbiguous(t *testing.T) {
	t.Parallel()
	command, state, _ := stdioSandbox(t, "--drop-after-effect-rate", "1")
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{Command: command, Tool: "create_ticket"}, 10*time.Second)
	if _, outcome, te := callKeyed(t, tool, "key_d", `{"title":"t"}`); outcome != tools.Ambiguous {
		t.Fatalf("got %v %+v, want ambiguous", outcome, te)
	}
	if _, tickets := stateOf(t, state); tickets != 1 {
		t.Fatalf("%d tickets, want the 1 made before the server died", tickets)
	}
}

func TestMCPCommandThatCannotStartIsNotSent(t *testing.T) {
	t.Parallel()
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{Command: []string{filepath.Join(t.TempDir(), "missing")}, Tool: "x"}, 5*time.Second)
	if _, outcome, te := callKeyed(t, tool, "key_m", `{}`); outcome != tools.NotSent {
		t.Fatalf("got %v %+v, want not sent", outcome, te)
	}
}
