package mcpfront_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/mcpfront"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// bundle is what a test needs: the stack (NATS, ledger, the demo registry
// and its sandbox, a worker) and the front door over HTTP.
type bundle struct {
	st    *embedded.Stack
	front *mcpfront.Server
	addr  string // host:port of the front door's HTTP server
}

// setup starts a stack with a worker and the front door of its registry,
// all stopped when the test ends. faults make the sandbox misbehave; cfg
// adjusts the front door's Config.
func setup(t *testing.T, faults sandbox.Faults, cfg ...func(*mcpfront.Config)) *bundle {
	t.Helper()
	st, quiet := workerStack(t, embedded.Config{SandboxFaults: faults}, worker.Config{})
	// The ledger lookup, which every consumer serves: the front door asks it
	// of a call answered indeterminate.
	lookup, err := worker.ServeLookup(st.Conn, st.Store, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lookup.Stop() })
	b := &bundle{st: st}
	b.front, b.addr = serve(t, st, quiet, cfg...)
	return b
}

// workerStack starts a stack of cfg and a worker of wcfg, both logging
// nowhere, stopped when the test ends; it returns the stack and that
// logger.
func workerStack(t *testing.T, cfg embedded.Config, wcfg worker.Config) (*embedded.Stack, *slog.Logger) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Logger, wcfg.Logger = quiet, quiet
	st, err := embedded.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, err := st.StartWorker(context.Background(), wcfg); err != nil {
		t.Fatal(err)
	}
	return st, quiet
}

// serve starts another front door on the stack's registry.
func serve(t *testing.T, st *embedded.Stack, logger *slog.Logger, cfg ...func(*mcpfront.Config)) (*mcpfront.Server, string) {
	t.Helper()
	c := mcpfront.Config{Registry: st.Tools, JS: st.JS, Logger: logger}
	for _, f := range cfg {
		f(&c)
	}
	front, err := mcpfront.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(front.Close)
	return front, serveFront(t, front)
}

// serveFront serves front over HTTP at /mcp until the test ends, and
// returns its host:port.
func serveFront(t *testing.T, front *mcpfront.Server) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/mcp", front.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close) // before front.Close: cleanups run last first
	return strings.TrimPrefix(srv.URL, "http://")
}

// connect opens a new MCP client session to the front door at addr (a
// re-issuing client may come back on a new one), closed when the test ends.
func connect(t *testing.T, addr string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "toolq-test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", DisableStandaloneSSE: true, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// named is the _meta that names a call of turn turn in conversation conv.
func named(conv string, turn int) mcp.Meta {
	return mcp.Meta{mcpfront.MetaConversationID: conv, mcpfront.MetaTurnIndex: turn}
}

func call(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any, meta mcp.Meta) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: meta})
}

// mustCall is call that fails the test on a protocol error.
func mustCall(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	res, err := call(context.Background(), cs, tool, args, meta)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

// text is the text of a result's one content block.
func text(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if len(res.Content) != 1 {
		t.Fatalf("want one content block, got %d", len(res.Content))
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("want text content, got %T", res.Content[0])
	}
	return tc.Text
}

func payment(invoice string) map[string]any {
	return map[string]any{"invoice_id": invoice, "amount_cents": 500, "currency": "EUR"}
}

func ticket(title string) map[string]any {
	return map[string]any{"title": title, "body": "the printer is on fire"}
}

func (b *bundle) payments(invoice string) int {
	n := 0
	for _, p := range b.st.Sandbox.Payments() {
		if p.InvoiceID == invoice {
			n++
		}
	}
	return n
}

func (b *bundle) tickets(title string) int {
	n := 0
	for _, tk := range b.st.Sandbox.Tickets() {
		if tk.Title == title {
			n++
		}
	}
	return n
}

// status is the result's io.toolq/status.
func status(res *mcp.CallToolResult) string {
	s, _ := res.Meta[mcpfront.MetaStatus].(string)
	return s
}

func key(res *mcp.CallToolResult) string {
	s, _ := res.Meta[mcpfront.MetaKey].(string)
	return s
}

// asJSON is v in JSON, for comparing results.
func asJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// notes is a keyed write whose executor counts its effects by text.
type notes struct {
	mu   sync.Mutex
	runs map[string]int
}

func (n *notes) count(text string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runs[text]
}

// noteStack starts a stack whose registry is one keyed write, store_note
// (args {"text": any string}), and a worker with wcfg; the caller serves
// the front door.
func noteStack(t *testing.T, wcfg worker.Config) (*embedded.Stack, *notes) {
	t.Helper()
	return approvalNoteStack(t, wcfg, nil)
}

// approvalNoteStack is noteStack whose store_note has the approval policy
// approval (nil: none).
func approvalNoteStack(t *testing.T, wcfg worker.Config, approval *tools.Approval) (*embedded.Stack, *notes) {
	t.Helper()
	n := &notes{runs: map[string]int{}}
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		var a struct{ Text string }
		if err := json.Unmarshal(r.Args, &a); err != nil {
			return nil, tools.DefiniteError("bad_args", err.Error())
		}
		n.mu.Lock()
		n.runs[a.Text]++
		n.mu.Unlock()
		return json.RawMessage(`{"stored":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{
		Name: "store_note", Class: tools.KeyedWrite, Executor: exec, Approval: approval,
		Schema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`),
	}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := workerStack(t, embedded.Config{Tools: reg}, wcfg)
	return st, n
}

func streamMsgs(t *testing.T, st *embedded.Stack, name string) uint64 {
	t.Helper()
	s, err := st.JS.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func TestMain(m *testing.M) { testenv.Main(m) }
