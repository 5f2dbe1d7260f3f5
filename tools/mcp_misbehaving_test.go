package tools_test

// The mcp executor against servers that misbehave: lines that are no
// answer, errors after the effect, forgotten sessions, load shedding,
// stdin that is not read, hostile tool lists.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/tools"
)

// ---------------------------------------------------------------------------
// A fake stdio MCP server: this test binary started again with
// TOOLQ_FAKE_MCP_STDIO set to the mode.

func TestFakeStdioMCPServer(t *testing.T) {
	mode := os.Getenv("TOOLQ_FAKE_MCP_STDIO")
	if mode == "" {
		t.Skip("the fake stdio MCP server of these tests, started by them")
	}
	fakeStdioServer(mode, os.Getenv("TOOLQ_FAKE_MCP_EFFECTS"), os.Getenv("TOOLQ_FAKE_MCP_PID"))
	os.Exit(0)
}

// fakeStdioCommand is the command (and env) that starts the fake server.
func fakeStdioCommand(t *testing.T, mode string) (m tools.MCP, effects, pidFile string) {
	t.Helper()
	dir := t.TempDir()
	effects, pidFile = filepath.Join(dir, "effects"), filepath.Join(dir, "pid")
	return tools.MCP{
		Command: []string{os.Args[0], "-test.run=^TestFakeStdioMCPServer$"},
		Env:     map[string]string{"TOOLQ_FAKE_MCP_STDIO": mode, "TOOLQ_FAKE_MCP_EFFECTS": effects, "TOOLQ_FAKE_MCP_PID": pidFile},
		Tool:    "pay",
	}, effects, pidFile
}

func fakeStdioServer(mode, effects, pidFile string) {
	os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())), 0o644)
	if mode == "mute" { // starts, never answers, and outlives its stdin
		io.Copy(io.Discard, os.Stdin)
		time.Sleep(time.Hour)
	}
	in := bufio.NewReader(os.Stdin)
	write := func(v any) {
		b, _ := json.Marshal(v)
		os.Stdout.Write(append(b, '\n'))
	}
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return
		}
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		json.Unmarshal(line, &msg)
		switch {
		case msg.Method == "notifications/initialized" && mode == "stop-reading":
			time.Sleep(time.Hour) // busy: stdin is no longer read
		case msg.ID == nil: // other notifications
		case msg.Method == "initialize":
			var p struct {
				ProtocolVersion string `json:"protocolVersion"`
			}
			json.Unmarshal(msg.Params, &p)
			write(map[string]any{"jsonrpc": "2.0", "id": msg.ID, "result": map[string]any{
				"protocolVersion": p.ProtocolVersion, "capabilities": map[string]any{"tools": map[string]any{}},
				"serverInfo": map[string]any{"name": "fake", "version": "1"}}})
		case msg.Method == "tools/call":
			f, _ := os.OpenFile(effects, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
			f.Write([]byte("paid\n")) // the effect
			f.Close()
			switch mode {
			case "env": // what the consumer's environment gave the server
				write(map[string]any{"jsonrpc": "2.0", "id": msg.ID, "result": map[string]any{"content": []any{map[string]any{"type": "text",
					"text": "DATABASE_URL=" + os.Getenv("DATABASE_URL") + " NATS_PASSWORD=" + os.Getenv("NATS_PASSWORD")}}}})
			case "id-null-error":
				// What JSON-RPC 2.0 says a server answers to input it could
				// not parse (an error whose id is null); here it follows an
				// effect, as it would for a line of another, concurrent call.
				os.Stdout.Write([]byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}` + "\n"))
			default:
				write(map[string]any{"jsonrpc": "2.0", "id": msg.ID, "result": map[string]any{"content": []any{map[string]any{"type": "text", "text": "paid"}}}})
			}
		default:
			write(map[string]any{"jsonrpc": "2.0", "id": msg.ID, "error": map[string]any{"code": -32601, "message": "method not found"}})
		}
	}
}

func effectCount(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "paid\n")
}

// A stdio server that writes one line that is JSON-RPC but neither a request
// nor a response with an id (e.g. {"jsonrpc":"2.0","id":null,"error":…},
// JSON-RPC's own answer to input it cannot parse) ends the SDK's read loop
// with an error the SDK makes itself: jsonrpc2.ErrInvalidRequest, a
// *jsonrpc.Error with code -32600. Every call in flight on the shared
// session is retired with it; serverError takes it for the server's answer,
// and a call that was written, and acted on, is classified Definite ("the
// downstream answered no"). It must be Ambiguous.
func TestMCPStdioCallInFlightWhenTheServerWritesAnIDLessLineIsNotDefinite(t *testing.T) {
	t.Parallel()
	m, effects, _ := fakeStdioCommand(t, "id-null-error")
	tool := mcpTool(t, tools.UnkeyedWrite, m, 10*time.Second)
	_, outcome, te := callKeyed(t, tool, "key_1", `{"amount_cents":500}`)
	if n := effectCount(t, effects); n != 1 {
		t.Fatalf("%d effects, want the 1 made before the server's line", n)
	}
	if outcome != tools.Ambiguous {
		t.Fatalf("a call the server acted on gave %v %+v: want ambiguous (the line was not an answer to it)", outcome, te)
	}
}

// A stdio server that stops reading its stdin (busy, or hung) while a call's
// arguments are bigger than the pipe's buffer: the SDK's ioConn.Write blocks
// in the pipe write, which no context interrupts, so the call outlives its
// timeout for as long as the server does not read (forever, for a hung
// server), and holds its concurrency slot and the session's write lock (every
// other call of that server waits too). Tool.Run waits for Execute. Nor does
// Registry.Close stop the server ("the consumer stops it at shutdown"): the
// SDK's Close waits for the call in flight before it closes stdin, so the
// consumer's shutdown hangs with it.
func TestMCPStdioCallEndsByItsTimeoutWhenTheServerStopsReading(t *testing.T) {
	t.Parallel()
	m, _, pidFile := fakeStdioCommand(t, "stop-reading")
	exec, err := tools.MCPExecutor(m)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "t", Class: tools.UnkeyedWrite, Schema: json.RawMessage(anySchema),
		Executor: exec, Downstream: exec.Downstream(), Timeout: time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("t")
	args := `{"blob":"` + strings.Repeat("x", 1<<20) + `"}`
	start := time.Now()
	done := make(chan tools.Outcome, 1)
	go func() {
		_, outcome, _ := callKeyed(t, tool, "key_1", args)
		done <- outcome
	}()
	var pid int
	testenv.Eventually(t, 20*time.Second, "the fake server started", func() bool {
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	select {
	case outcome := <-done:
		t.Logf("returned after %v: %v", time.Since(start).Round(time.Millisecond), outcome)
		reg.Close()
		return
	case <-time.After(8 * time.Second):
	}
	closed := make(chan struct{})
	go func() { reg.Close(); close(closed) }()
	closeHung := false
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		closeHung = true
	}
	syscall.Kill(pid, syscall.SIGKILL) // unblock the write, to end the test
	outcome := <-done
	<-closed
	t.Fatalf("a call with a 1 s timeout was still running after 8 s (it returned %v only once the server was killed, after %v); Registry.Close hung: %v",
		outcome, time.Since(start).Round(time.Millisecond), closeHung)
}

// A stdio server is a program toolq starts, often third-party code (npx -y
// some-mcp-server). connect gives it the consumer's whole environment
// (cmd.Env = os.Environ() + env, or nil: inherit), and the consumer takes its
// credentials from the environment: DATABASE_URL (the ledger's Postgres),
// NATS_PASSWORD, NATS_TOKEN, NATS_NKEY… A tool server that can write the
// ledger can forge or erase the claims and completions the promise rests on.
// The official TypeScript SDK's StdioClientTransport inherits only a short
// list (HOME, LOGNAME, PATH, SHELL, TERM, USER: getDefaultEnvironment) plus
// the env it is given. (Not parallel: it sets the process environment.)
func TestMCPStdioServerDoesNotInheritTheConsumersCredentials(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://toolq:ledger-secret@db/toolq")
	t.Setenv("NATS_PASSWORD", "nats-secret")
	m, _, _ := fakeStdioCommand(t, "env")
	tool := mcpTool(t, tools.Read, m, 10*time.Second)
	out, outcome, te := callKeyed(t, tool, "", `{}`)
	if outcome != tools.Success {
		t.Fatalf("%v %+v", outcome, te)
	}
	if strings.Contains(string(out), "secret") {
		t.Fatalf("the stdio server was given the consumer's credentials: %s", out)
	}
}

// A stdio server's one session is opened under sessionPool.mu, a plain
// mutex: while one call waits for the server's initialize (up to its whole
// timeout, then the SDK's Close of the failed session: closing stdin and
// TerminateDuration before SIGTERM), every other call of that server waits
// on the mutex past its own timeout, then opens its own attempt. Calls queue:
// the n-th returns after about n × (timeout + 2 s).
func TestMCPStdioCallsWaitingForTheServerToStartEndByTheirTimeout(t *testing.T) {
	t.Parallel()
	m, _, _ := fakeStdioCommand(t, "mute")
	tool := mcpTool(t, tools.UnkeyedWrite, m, time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var took []time.Duration
	for i := range 3 {
		wg.Go(func() {
			start := time.Now()
			_, outcome, te := callKeyed(t, tool, "key_"+strconv.Itoa(i), `{}`)
			if outcome != tools.NotSent {
				t.Errorf("call %d: %v %+v, want not sent (no session)", i, outcome, te)
			}
			mu.Lock()
			took = append(took, time.Since(start).Round(100*time.Millisecond))
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, d := range took {
		if d > 3*time.Second {
			t.Fatalf("calls with a 1 s timeout took %v", took)
		}
	}
}

// ---------------------------------------------------------------------------
// Servers built with the official Go SDK, over Streamable HTTP.

func goSDKServer(t *testing.T, add func(*mcp.Server), wrap func(http.Handler) http.Handler) string {
	t.Helper()
	return serveGoSDK(t, nil, add, wrap)
}

// statelessServer is a Go SDK server in stateless mode: it speaks protocol
// 2026-07-28 (SEP-2575) with the executor's client, with no session ID.
func statelessServer(t *testing.T, add func(*mcp.Server), wrap func(http.Handler) http.Handler) string {
	t.Helper()
	return serveGoSDK(t, &mcp.StreamableHTTPOptions{Stateless: true}, add, wrap)
}

func serveGoSDK(t *testing.T, opts *mcp.StreamableHTTPOptions, add func(*mcp.Server), wrap func(http.Handler) http.Handler) string {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "hostile", Version: "1"}, nil)
	add(srv)
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, opts)
	if wrap != nil {
		h = wrap(h)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

// The Go SDK turns any error that is not a *jsonrpc.Error, returned by a
// tool handler (raw ToolHandler) or made by the SDK itself after the handler
// ran (typed handler: "validating tool output", "marshaling output"), into a
// JSON-RPC error with code 0 (jsonrpc2.toWireError). classifyError reads
// every code but -32603 and -32000…-32099 as Definite, so code 0, which
// comes after the effect, reads as "the server answered no".
func TestMCPJSONRPCErrorWithCodeZeroAfterTheEffectIsNotDefinite(t *testing.T) {
	t.Parallel()
	type receipt struct {
		AmountCents int `json:"amount_cents"`
	}
	var effects atomic.Int32
	url := goSDKServer(t, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "pay_raw", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				effects.Add(1) // the charge
				return nil, errors.New("charged, but the receipt could not be stored")
			})
		mcp.AddTool(srv, &mcp.Tool{Name: "pay_typed",
			OutputSchema: json.RawMessage(`{"type":"object","required":["amount_cents"],"properties":{"amount_cents":{"type":"integer","minimum":1}}}`)},
			func(ctx context.Context, req *mcp.CallToolRequest, in map[string]any) (*mcp.CallToolResult, receipt, error) {
				effects.Add(1) // the charge; the SDK then finds the output off its schema
				return nil, receipt{}, nil
			})
	}, nil)
	for _, name := range []string{"pay_raw", "pay_typed"} {
		t.Run(name, func(t *testing.T) {
			before := effects.Load()
			tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url + "/mcp", Tool: name}, 5*time.Second)
			_, outcome, te := callKeyed(t, tool, "key_"+name, `{}`)
			if effects.Load() != before+1 {
				t.Fatalf("the tool did not act")
			}
			if outcome != tools.Ambiguous {
				t.Fatalf("an error that came after the effect gave %v %+v, want ambiguous", outcome, te)
			}
		})
	}
}

// isError: true is how both official SDKs report any error of a tool
// handler (Go: a typed handler's returned error; TypeScript: an exception
// the handler threw), one after the effect included. By default it is the
// tool's answer (definite), as MCP designs it; a registry entry with
// is_error: ambiguous reads it as uncertain, for servers whose tools fail
// after acting.
func TestMCPIsErrorAfterTheEffectIsAmbiguousWhereTheRegistrySaysSo(t *testing.T) {
	t.Parallel()
	var effects atomic.Int32
	url := goSDKServer(t, func(srv *mcp.Server) {
		mcp.AddTool(srv, &mcp.Tool{Name: "pay"},
			func(ctx context.Context, req *mcp.CallToolRequest, in map[string]any) (*mcp.CallToolResult, any, error) {
				effects.Add(1) // the charge
				return nil, nil, errors.New("charged, but writing the receipt failed")
			})
	}, nil)
	for _, tc := range []struct {
		isError string
		want    tools.Outcome
	}{{"", tools.Definite}, {"ambiguous", tools.Ambiguous}} {
		tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url + "/mcp", Tool: "pay", IsError: tc.isError}, 5*time.Second)
		_, outcome, te := callKeyed(t, tool, "key_"+tc.isError, `{}`)
		if outcome != tc.want {
			t.Fatalf("is_error %q: a tool error after the effect gave %v %+v, want %v", tc.isError, outcome, te, tc.want)
		}
	}
	if effects.Load() != 2 {
		t.Fatalf("%d effects, want 2", effects.Load())
	}
}

// sessionRecorder notes the session ids a server hands out.
type sessionRecorder struct {
	http.ResponseWriter
	known *sync.Map
}

func (w sessionRecorder) note() {
	if sid := w.Header().Get("Mcp-Session-Id"); sid != "" {
		w.known.Store(sid, true)
	}
}
func (w sessionRecorder) WriteHeader(code int)        { w.note(); w.ResponseWriter.WriteHeader(code) }
func (w sessionRecorder) Write(b []byte) (int, error) { w.note(); return w.ResponseWriter.Write(b) }
func (w sessionRecorder) Flush()                      { w.ResponseWriter.(http.Flusher).Flush() }
func (w sessionRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// sessionNotFound answers a request for a session the server does not know
// as a Python SDK server does (streamable_http_manager._send_session_not_found).
func sessionNotFound(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	io.WriteString(w, `{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Session not found"}}`)
}

// typeScriptSessionNotFound answers a request for a session the server does
// not know as a TypeScript SDK server does (StreamableHTTPServerTransport's
// validateSession): 404, a JSON-RPC error with id null.
func typeScriptSessionNotFound(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	io.WriteString(w, `{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}`)
}

// typeScriptExampleNoSession answers a request for a session the server
// does not know as the TypeScript SDK's example servers and the reference
// server ("everything") do: 400, a JSON-RPC error with no id (they echo
// the id of a body they do not parse).
func typeScriptExampleNoSession(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusBadRequest)
	io.WriteString(w, `{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"}}`)
}

// forgetfulServer is a Python-SDK-like server of one tool, create_ticket,
// answered by handle: restart makes it forget every session it handed out,
// which it then answers with notFound. It returns the server's URL.
func forgetfulServer(t *testing.T, notFound func(http.ResponseWriter), handle mcp.ToolHandler) (url string, restart func()) {
	t.Helper()
	var known sync.Map
	var current atomic.Pointer[http.Handler]
	restart = func() {
		known.Clear()
		srv := mcp.NewServer(&mcp.Implementation{Name: "python-like", Version: "1"}, nil)
		srv.AddTool(&mcp.Tool{Name: "create_ticket", InputSchema: json.RawMessage(`{"type":"object"}`)}, handle)
		var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
		current.Store(&h)
	}
	restart()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
			if _, ok := known.Load(sid); !ok {
				notFound(w)
				return
			}
		}
		(*current.Load()).ServeHTTP(sessionRecorder{w, &known}, r)
	}))
	t.Cleanup(ts.Close)
	return ts.URL, restart
}

// Python SDK servers (StreamableHTTPSessionManager, as quoted by projects
// built on it) answer a request for a session they do not know (restarted,
// or the session expired) with 404 and a JSON-RPC error whose id is the
// placeholder string "server-error", code -32600 (INVALID_REQUEST), "Session
// not found"; the SDK's transport gives all its errors that id. (Older
// releases answer 400 in plain text: the server-everything case, ambiguous.)
// Any JSON-RPC error body with a non-null id does this. The Go SDK decodes that
// body (a string id is valid) and returns the server's error: Execute
// classifies it Definite (jsonrpc_-32600) instead of "session gone", does
// not retry on a new session, and healthy() keeps the dead session in the
// pool, which the next call takes again: every call after a restart of the
// server fails, definitely, for as long as the consumer runs.
func TestMCPSessionAPythonSDKServerForgotIsReplacedNotDefinite(t *testing.T) {
	t.Parallel()
	forgottenSessionIsReplaced(t, sessionNotFound)
}

// A TypeScript SDK server answers a session it does not know with a
// JSON-RPC error whose id is null (404), its example servers and the
// reference server with one with no id (400, "No valid session ID"): a
// forgotten session, and the call is sent once on a new one.
func TestMCPSessionATypeScriptSDKServerForgotIsReplaced(t *testing.T) {
	t.Parallel()
	for name, refusal := range map[string]func(http.ResponseWriter){"transport 404": typeScriptSessionNotFound, "example server 400": typeScriptExampleNoSession} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forgottenSessionIsReplaced(t, refusal)
		})
	}
}

// forgottenSessionIsReplaced: after a server that answers a session it
// does not know with refusal restarted, each call is sent once, on a new
// session, and succeeds.
func forgottenSessionIsReplaced(t *testing.T, refusal func(http.ResponseWriter)) {
	t.Helper()
	var effects atomic.Int32
	url, restart := forgetfulServer(t, refusal, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		effects.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ticket"}}}, nil
	})
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url, Tool: "create_ticket"}, 5*time.Second)
	if _, outcome, te := callKeyed(t, tool, "key_1", `{}`); outcome != tools.Success {
		t.Fatalf("first call: %v %+v", outcome, te)
	}
	restart() // same effects kept; its sessions are gone
	var failed []string
	for i := 2; i <= 4; i++ {
		if _, outcome, te := callKeyed(t, tool, "key_"+strconv.Itoa(i), `{}`); outcome != tools.Success {
			failed = append(failed, outcome.String()+" "+te.Code)
		}
	}
	if len(failed) > 0 {
		t.Fatalf("after the server restarted, calls gave %v (effects: %d): want each sent once on a new session", failed, effects.Load())
	}
}

// After the server restarted, a call refused on its stale session is sent
// once more, at once, on a session opened then, and the other idle sessions
// (as stale) are dropped: the retry took the next idle session, stale as
// well whenever calls had run side by side before, and the call came back
// not sent, as did the next ones, for as many sessions as the pool held.
func TestMCPAfterARestartACallIsSentOnANewSessionNotAnotherStaleOne(t *testing.T) {
	t.Parallel()
	url, restart := forgetfulServer(t, sessionNotFound, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		time.Sleep(300 * time.Millisecond) // the calls overlap: one session each
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ticket"}}}, nil
	})
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url, Tool: "create_ticket"}, 10*time.Second)
	var wg sync.WaitGroup
	for i := range 3 { // three calls at once: three sessions, idle afterwards
		wg.Go(func() {
			if _, outcome, te := callKeyed(t, tool, "key_a"+strconv.Itoa(i), `{}`); outcome != tools.Success {
				t.Errorf("call %d: %v %+v", i, outcome, te)
			}
		})
	}
	wg.Wait()
	restart()
	_, outcome, te := callKeyed(t, tool, "key_after", `{}`)
	if outcome != tools.Success {
		t.Fatalf("the first call after the server restarted gave %v %+v: want it sent once more, at once, on a new session", outcome, te)
	}
}

// The SDK sets Mcp-Protocol-Version on every request after initialize from
// streamableClientConn.sessionUpdated, which it calls through the optional
// clientConnection interface. trackedConn embeds only mcp.Connection, so the
// SDK's type assertion fails, sessionUpdated is never called, and no request
// of the session carries the header (the 2025-06-18 transport: "the client
// MUST include the MCP-Protocol-Version header on all subsequent requests").
// A server that enforces it answers 400, which Execute classifies ambiguous:
// every unkeyed write indeterminate.
func TestMCPToolsCallCarriesTheProtocolVersionHeader(t *testing.T) {
	t.Parallel()
	var versions sync.Map // method → Mcp-Protocol-Version
	url := goSDKServer(t, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
			})
	}, recordPosts(func(method string, h http.Header, _ []byte) { versions.Store(method, h.Get("Mcp-Protocol-Version")) }))
	tool := mcpTool(t, tools.Read, tools.MCP{URL: url, Tool: "echo"}, 5*time.Second)
	if _, outcome, te := callKeyed(t, tool, "", `{}`); outcome != tools.Success {
		t.Fatalf("%v %+v", outcome, te)
	}
	v, _ := versions.Load("tools/call")
	if v == "" {
		t.Fatalf("the tools/call POST had no Mcp-Protocol-Version header")
	}
}

// recordPosts calls note with the JSON-RPC method, the headers and the body
// of every POST, before the server handles it.
func recordPosts(note func(method string, h http.Header, body []byte)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				var msg struct {
					Method string `json:"method"`
				}
				json.Unmarshal(body, &msg)
				note(msg.Method, r.Header.Clone(), body)
			}
			next.ServeHTTP(w, r)
		})
	}
}

// The key's header is for tools/call. mcpTransport adds it to every POST
// whose context carries the call, and the SDK sends notifications/cancelled
// (after a timeout) with context.WithoutCancel of the call's context: the
// notification carries the call's Idempotency-Key too. An HTTP idempotency
// layer in front of the server (what the header is for) sees a second,
// different request under the same key. The notification's answer is also
// recorded as the call's HTTP status (p.status), and its connection marks
// the call sent. (The notification races with the pool's Close of the
// session after the timeout, so the test times out a few calls.)
func TestMCPIdempotencyKeyHeaderIsSentOnToolsCallOnly(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var leaked []string
	url := goSDKServer(t, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "slow", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
			})
	}, recordPosts(func(method string, h http.Header, _ []byte) {
		if k := h.Get("Idempotency-Key"); k != "" && method != "tools/call" {
			mu.Lock()
			leaked = append(leaked, method+" with Idempotency-Key "+k)
			mu.Unlock()
		}
	}))
	tool := mcpTool(t, tools.KeyedWrite, tools.MCP{URL: url, Tool: "slow"}, 100*time.Millisecond)
	timedOut := 0
	for i := range 150 {
		_, outcome, te := callKeyed(t, tool, "key_"+strconv.Itoa(i), `{}`)
		switch {
		case outcome == tools.Ambiguous:
			timedOut++
		case outcome == tools.NotSent && te != nil && te.Code == "mcp_connect":
			// On a loaded machine a new session may not open within the
			// call's 100ms: that call was never sent, and its timeout sends
			// no notification.
			continue
		default:
			t.Fatalf("%v %+v, want the timeout's ambiguous", outcome, te)
		}
		time.Sleep(30 * time.Millisecond)
		mu.Lock()
		n := len(leaked)
		mu.Unlock()
		if n > 0 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(leaked) > 0 {
		t.Fatalf("requests other than tools/call carried the call's key: %v", leaked)
	}
	if timedOut == 0 {
		t.Fatal("no call timed out after it was sent: nothing was tested")
	}
}

// A tools/call is known as one however large its args: the executor reads
// the head of each POST's body for its method, where it once decoded at
// most 4 MiB of it and took a larger call for another request. Such a call
// was never marked sent, its POST's status not recorded and its key's
// header not added: a server that stored the document and then answered
// 500 (or cut the connection) left it "not sent", and an unkeyed write was
// sent again.
func TestMCPLargeCallThatActedThenFailedIsAmbiguousNotNotSent(t *testing.T) {
	t.Parallel()
	var effects atomic.Int32
	var keyHeader atomic.Value
	srv := mcp.NewServer(&mcp.Implementation{Name: "upload", Version: "1"}, nil)
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body[:min(len(body), 200)], []byte(`"tools/call"`)) {
				keyHeader.Store(r.Header.Get("Idempotency-Key"))
				effects.Add(1) // the document is stored
				http.Error(w, "internal error after storing", http.StatusInternalServerError)
				return
			}
		}
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: ts.URL, Tool: "store_document"}, 20*time.Second)
	args := `{"doc":"` + strings.Repeat("A", 5<<20) + `"}` // a 5 MiB attachment
	_, outcome, te := callKeyed(t, tool, "key_doc", args)
	if effects.Load() != 1 {
		t.Fatalf("%d effects", effects.Load())
	}
	if outcome != tools.Ambiguous {
		t.Fatalf("a tools/call the server received and acted on (then answered 500) gave %v %+v (Idempotency-Key header %q): want ambiguous, never not sent", outcome, te, keyHeader.Load())
	}
}

// A JSON-RPC error is the server's answer to a call only when it is the
// response to the call's request. A server (Python SDK style) takes a
// tools/call, opens its SSE response stream with a numbered event, acts,
// and restarts: the stream is cut. The SDK resumes it with a GET carrying
// Last-Event-ID; the restarted server answers 404 with a JSON-RPC error
// body, -32600 "Session not found", and the SDK fails the connection with
// an error that wraps it. The call's POST was answered 200, and that -32600
// was read as the server's answer to the call: definite. The call was
// written and acted on: an unkeyed write is ambiguous (indeterminate), a
// keyed one retried under its key.
func TestMCPStreamCutAfterTheEffectWhoseResumeFindsTheSessionGoneIsAmbiguous(t *testing.T) {
	t.Parallel()
	var effects atomic.Int32
	srv := mcp.NewServer(&mcp.Implementation{Name: "python-like", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "create_ticket", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ticket"}}}, nil
		})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	var restarted atomic.Bool
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if restarted.Load() && r.Header.Get("Mcp-Session-Id") != "" {
			sessionNotFound(w)
			return
		}
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				Method string `json:"method"`
			}
			json.Unmarshal(body, &msg)
			if msg.Method == "tools/call" {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Header().Set("Mcp-Session-Id", r.Header.Get("Mcp-Session-Id"))
				w.WriteHeader(http.StatusOK)
				io.WriteString(w, "id: ev-1\ndata: \n\n") // the priming event (SEP-1699): resumable
				w.(http.Flusher).Flush()
				effects.Add(1)        // the ticket is made
				restarted.Store(true) // and the server restarts: the stream ends unanswered
				return
			}
		}
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: ts.URL, Tool: "create_ticket"}, 15*time.Second)
	_, outcome, te := callKeyed(t, tool, "key_1", `{}`)
	if effects.Load() != 1 {
		t.Fatalf("%d effects, want 1", effects.Load())
	}
	if outcome != tools.Ambiguous {
		t.Fatalf("a call written and acted on, whose stream was cut and whose resume found the session gone, gave %v %+v: want ambiguous", outcome, te)
	}
}

// An HTTP idempotency layer in front of an MCP server answers 409 to a
// request under a key whose first request is still in flight (as the
// sandbox's HTTP API does). The call is then uncertain, as for the http
// executor: ambiguous, retried later under its key, never the server's
// final no while the first request pays.
func TestMCPConflictOnTheCallsKeyIsAmbiguous(t *testing.T) {
	t.Parallel()
	var busy atomic.Bool
	url := goSDKServer(t, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "pay", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "paid"}}}, nil
			})
	}, func(next http.Handler) http.Handler {
		// The gateway: the key "key_busy" is held by another request (as
		// after a lost claim), so its tools/call gets 409.
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && strings.Contains(r.Header.Get("Idempotency-Key"), "key_busy") {
				body, _ := io.ReadAll(r.Body)
				if strings.Contains(string(body), `"tools/call"`) {
					busy.Store(true)
					w.Header().Set("Retry-After", "1")
					http.Error(w, `{"error":"a request with this key is still being processed"}`, http.StatusConflict)
					return
				}
				r.Body = io.NopCloser(strings.NewReader(string(body)))
			}
			next.ServeHTTP(w, r)
		})
	})
	tool := mcpTool(t, tools.KeyedWrite, tools.MCP{URL: url, Tool: "pay"}, 5*time.Second)
	_, outcome, te := callKeyed(t, tool, "key_busy", `{}`)
	if !busy.Load() {
		t.Fatal("the gateway did not answer 409")
	}
	if outcome != tools.Ambiguous {
		t.Fatalf("409 to a call that carried its key (same key in flight downstream) gave %v %+v: want ambiguous, retried under the key (as the http executor does)", outcome, te)
	}
}

// A server on protocol 2026-07-28 (SEP-2575; the Go SDK's stateless mode,
// which the executor's client negotiates by default) answers a tools/call
// whose JSON-RPC error is invalid params (-32602) with HTTP 400, and method
// not found with 404: the server's answer to the call, after its handler
// ran. Taken for a session the server forgot, it was sent again on a new
// session: a tool that acted and then said -32602 (a late validation, say)
// acted twice in one Execute. There is no session to forget: the server is
// stateless.
func TestMCPInvalidParamsAs400OnAReusedStatelessSessionIsNotSentAgain(t *testing.T) {
	t.Parallel()
	var effects, calls atomic.Int32
	url := statelessServer(t, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "create_ticket", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				effects.Add(1) // the ticket is made
				var args struct{ Priority string }
				json.Unmarshal(req.Params.Arguments, &args)
				if args.Priority == "urgent" {
					// made, but the pager it was to notify refuses the priority
					return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "priority urgent: no pager on duty"}
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ticket"}}}, nil
			})
	}, recordPosts(func(method string, _ http.Header, body []byte) {
		if method == "tools/call" && bytes.Contains(body, []byte("urgent")) {
			calls.Add(1)
		}
	}))
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url, Tool: "create_ticket"}, 10*time.Second)
	if _, outcome, te := callKeyed(t, tool, "key_1", `{}`); outcome != tools.Success {
		t.Fatalf("first call: %v %+v", outcome, te)
	}
	_, outcome, te := callKeyed(t, tool, "key_2", `{"priority":"urgent"}`)
	if effects.Load() != 2 || calls.Load() != 1 {
		t.Fatalf("an unkeyed write answered -32602 (HTTP 400, SEP-2575) on a reused session was sent %d times, %d effects (want 1 and 2 in all); outcome %v %+v", calls.Load(), effects.Load()-1, outcome, te)
	}
	if outcome != tools.Definite || te.Code != "jsonrpc_-32602" {
		t.Fatalf("invalid params answered as a 400: %v %+v, want definite jsonrpc_-32602", outcome, te)
	}
}

// A 4xx whose body is the JSON-RPC answer to the call (its id) is the
// server's answer even on a session with an ID: the server knew the
// session, and may have run the tool.
func TestMCPJSONRPCAnswerInA400OnAStatefulSessionIsNotSentAgain(t *testing.T) {
	t.Parallel()
	var effects, calls atomic.Int32
	url := goSDKServer(t, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "create_ticket", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				effects.Add(1)
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ticket"}}}, nil
			})
	}, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			json.Unmarshal(body, &msg)
			if msg.Method == "tools/call" && calls.Add(1) > 1 {
				effects.Add(1) // acted, then answered as a 2026-07-28 server does
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(msg.ID)+`,"error":{"code":-32602,"message":"late validation"}}`)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url, Tool: "create_ticket"}, 10*time.Second)
	if _, outcome, te := callKeyed(t, tool, "key_1", `{}`); outcome != tools.Success {
		t.Fatalf("first call: %v %+v", outcome, te)
	}
	_, outcome, te := callKeyed(t, tool, "key_2", `{}`)
	if calls.Load() != 2 || outcome != tools.Definite {
		t.Fatalf("a call answered -32602 in a 400 on a stateful session: %d tools/call POSTs in all (want 2), %d effects; %v %+v, want definite", calls.Load(), effects.Load(), outcome, te)
	}
}

// answeringSecondCallIn4xx is a Go SDK server with session IDs whose tool,
// create_ticket, counts its effects; its second tools/call acts and is then
// answered by answer (w, the call's raw id) instead of the server.
func answeringSecondCallIn4xx(t *testing.T, effects, calls *atomic.Int32, answer func(w http.ResponseWriter, id json.RawMessage)) string {
	t.Helper()
	return goSDKServer(t, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "create_ticket", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				effects.Add(1)
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ticket"}}}, nil
			})
	}, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			json.Unmarshal(body, &msg)
			if msg.Method == "tools/call" && calls.Add(1) == 2 {
				effects.Add(1) // acted, then answered in a 4xx
				answer(w, msg.ID)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
}

// secondCall makes two calls of create_ticket at url, the second on the
// session of the first, and returns what the second gave.
func secondCall(t *testing.T, url string) (tools.Outcome, *tools.Error) {
	t.Helper()
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url, Tool: "create_ticket"}, 10*time.Second)
	if _, outcome, te := callKeyed(t, tool, "key_1", `{}`); outcome != tools.Success {
		t.Fatalf("first call: %v %+v", outcome, te)
	}
	_, outcome, te := callKeyed(t, tool, "key_2", `{}`)
	return outcome, te
}

// The call's JSON-RPC answer in a 400 whose body is over what the executor
// reads of it (an error with large data: the validation report of a large
// call, say) cannot be told from a refused session: the call may have run,
// and is ambiguous, never sent again. It was taken for a forgotten session
// and sent again at once.
func TestMCPLargeJSONRPCAnswerInA400IsNotSentAgain(t *testing.T) {
	t.Parallel()
	var effects, calls atomic.Int32
	url := answeringSecondCallIn4xx(t, &effects, &calls, func(w http.ResponseWriter, id json.RawMessage) {
		data, _ := json.Marshal(map[string]string{"report": strings.Repeat("x", 70<<10)})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(id)+`,"error":{"code":-32602,"message":"late validation","data":`+string(data)+`}}`)
	})
	outcome, te := secondCall(t, url)
	if calls.Load() != 2 {
		t.Fatalf("a call answered -32602 in a 400 with a 70 KiB body was sent again: %d tools/call POSTs (want 2), %d effects; %v %+v", calls.Load(), effects.Load(), outcome, te)
	}
	if outcome != tools.Ambiguous {
		t.Fatalf("a call answered in a 400 too large to read: %v %+v, want ambiguous", outcome, te)
	}
}

// The call's answer with its id echoed as a string ("2" for 2) is its
// answer still, as the SDK reads it: classified (invalid params: definite),
// not sent again.
func TestMCPJSONRPCAnswerInA400WithTheIDAsAStringIsNotSentAgain(t *testing.T) {
	t.Parallel()
	var effects, calls atomic.Int32
	url := answeringSecondCallIn4xx(t, &effects, &calls, func(w http.ResponseWriter, id json.RawMessage) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"jsonrpc":"2.0","id":"`+strings.Trim(string(id), `"`)+`","error":{"code":-32602,"message":"late validation"}}`)
	})
	outcome, te := secondCall(t, url)
	if calls.Load() != 2 {
		t.Fatalf("a call answered -32602 in a 400 (id echoed as a string) was sent again: %d tools/call POSTs (want 2), %d effects; %v %+v", calls.Load(), effects.Load(), outcome, te)
	}
	if outcome != tools.Definite || te.Code != "jsonrpc_-32602" {
		t.Fatalf("invalid params in a 400, the id as a string: %v %+v, want definite jsonrpc_-32602", outcome, te)
	}
}

// A 400 whose body is a JSON-RPC response with another id than the call's
// is not what a server says of a session it does not know (null, or the
// Python SDK's "server-error"): ambiguous, not sent again.
func TestMCPJSONRPCResponseWithAnotherIDInA400IsNotSentAgain(t *testing.T) {
	t.Parallel()
	var effects, calls atomic.Int32
	url := answeringSecondCallIn4xx(t, &effects, &calls, func(w http.ResponseWriter, id json.RawMessage) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"jsonrpc":"2.0","id":9999,"error":{"code":-32602,"message":"late validation"}}`)
	})
	outcome, te := secondCall(t, url)
	if calls.Load() != 2 {
		t.Fatalf("a call answered in a 400 with another id was sent again: %d tools/call POSTs (want 2), %d effects; %v %+v", calls.Load(), effects.Load(), outcome, te)
	}
	if outcome != tools.Ambiguous {
		t.Fatalf("a call answered in a 400 with another id: %v %+v, want ambiguous", outcome, te)
	}
}

// The answer in a 400 whose body is cut short (the connection drops): the
// server was answering the call, which may have run: ambiguous, never sent
// again as on a forgotten session.
func TestMCPAnswerInA400CutShortIsNotSentAgain(t *testing.T) {
	t.Parallel()
	var effects, calls atomic.Int32
	url := answeringSecondCallIn4xx(t, &effects, &calls, func(w http.ResponseWriter, id json.RawMessage) {
		full := `{"jsonrpc":"2.0","id":` + string(id) + `,"error":{"code":-32602,"message":"late validation"}}`
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "200")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, full[:len(full)/2])
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	outcome, te := secondCall(t, url)
	if calls.Load() != 2 {
		t.Fatalf("a call whose 400 answer was cut short was sent again: %d tools/call POSTs (want 2), %d effects; %v %+v", calls.Load(), effects.Load(), outcome, te)
	}
	if outcome != tools.Ambiguous {
		t.Fatalf("a call whose 400 answer was cut short: %v %+v, want ambiguous", outcome, te)
	}
}

// A 400 whose body carries the call's answer, or may, in a form other than
// one JSON-RPC response (a batch, SSE framing, a byte order mark, two
// messages, a member named twice, JSON that is not quite JSON-RPC) is not
// what a server says of a session it does not know: the call, which acted,
// is not sent again. Each was taken for a forgotten session.
func TestMCPAnswerInAnUnusual4xxBodyIsNotSentAgain(t *testing.T) {
	errOf := func(id json.RawMessage) string {
		return `{"jsonrpc":"2.0","id":` + string(id) + `,"error":{"code":-32602,"message":"late validation"}}`
	}
	cases := []struct {
		name  string
		ctype string
		body  func(id json.RawMessage) string
	}{
		{"batch array", "application/json", func(id json.RawMessage) string { return "[" + errOf(id) + "]" }},
		{"utf8 BOM", "application/json", func(id json.RawMessage) string { return "\xef\xbb\xbf" + errOf(id) }},
		{"SSE framed", "text/event-stream", func(id json.RawMessage) string { return "event: message\ndata: " + errOf(id) + "\n\n" }},
		{"no jsonrpc member", "application/json", func(id json.RawMessage) string {
			return `{"id":` + string(id) + `,"error":{"code":-32602,"message":"late validation"}}`
		}},
		{"jsonrpc 2.0 as number", "application/json", func(id json.RawMessage) string {
			return `{"jsonrpc":2.0,"id":` + string(id) + `,"error":{"code":-32602,"message":"late validation"}}`
		}},
		{"id leading zero", "application/json", func(id json.RawMessage) string {
			return `{"jsonrpc":"2.0","id":0` + string(id) + `,"error":{"code":-32602,"message":"late validation"}}`
		}},
		{"duplicate id keys, last null", "application/json", func(id json.RawMessage) string {
			return `{"jsonrpc":"2.0","id":` + string(id) + `,"error":{"code":-32602,"message":"late validation"},"id":null}`
		}},
		{"result in a 400", "application/json", func(id json.RawMessage) string {
			return `{"jsonrpc":"2.0","id":` + string(id) + `,"result":{"content":[{"type":"text","text":"ticket"}]}}`
		}},
		{"id as float", "application/json", func(id json.RawMessage) string {
			return `{"jsonrpc":"2.0","id":` + string(id) + `.0,"error":{"code":-32602,"message":"late validation"}}`
		}},
		{"notification with the call's outcome", "application/json", func(id json.RawMessage) string {
			return `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"error","data":"ticket created, then failed"}}`
		}},
		{"trailing garbage", "application/json", func(id json.RawMessage) string { return errOf(id) + "\n\x00" }},
		{"two messages", "application/json", func(id json.RawMessage) string { return errOf(id) + "\n" + errOf(id) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var effects, calls atomic.Int32
			url := answeringSecondCallIn4xx(t, &effects, &calls, func(w http.ResponseWriter, id json.RawMessage) {
				w.Header().Set("Content-Type", c.ctype)
				w.WriteHeader(http.StatusBadRequest)
				io.WriteString(w, c.body(id))
			})
			outcome, te := secondCall(t, url)
			if calls.Load() != 2 || outcome == tools.NotSent {
				t.Fatalf("acted, answered in a 400 (%s): %d tools/call POSTs (want 2), %d effects; %v %+v", c.name, calls.Load(), effects.Load(), outcome, te)
			}
			t.Logf("%s: %v %+v", c.name, outcome, te)
		})
	}
}

// A proxy in front of a stateful server replaces the server's answer, after
// the tool acted, with a page of its own: a WAF blocking the response
// (ModSecurity/CRS outbound rules: 403 text/html), nginx with
// proxy_intercept_errors replacing a 2026-07-28 server's 400 answer by its
// error page, or a gateway quoting the upstream answer as a Go string. The
// call acted; it must not be sent again. Only an SDK's own refusal of a
// session it does not know, a 404, reads as a forgotten session.
func TestMCPProxyPageAfterTheEffectIsNotSentAgain(t *testing.T) {
	cases := []struct {
		name   string
		status int
		ctype  string
		body   func(id json.RawMessage) string
	}{
		{"modsecurity outbound 403 html", http.StatusForbidden, "text/html; charset=iso-8859-1", func(json.RawMessage) string {
			return "<!DOCTYPE HTML PUBLIC \"-//IETF//DTD HTML 2.0//EN\">\n<html><head>\n<title>403 Forbidden</title>\n</head><body>\n<h1>Forbidden</h1>\n<p>You don't have permission to access this resource.</p>\n</body></html>\n"
		}},
		{"nginx proxy_intercept_errors 400 html", http.StatusBadRequest, "text/html", func(json.RawMessage) string {
			return "<html>\r\n<head><title>400 Bad Request</title></head>\r\n<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
		}},
		{"nginx 404 html", http.StatusNotFound, "text/html", func(json.RawMessage) string {
			return "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
		}},
		{"gateway quoting the upstream answer", http.StatusBadRequest, "text/plain; charset=utf-8", func(id json.RawMessage) string {
			return "upstream rejected: " + strconv.Quote(`{"jsonrpc":"2.0","id":`+string(id)+`,"error":{"code":-32602,"message":"late validation"}}`) + "\n"
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var effects, calls atomic.Int32
			url := answeringSecondCallIn4xx(t, &effects, &calls, func(w http.ResponseWriter, id json.RawMessage) {
				w.Header().Set("Content-Type", c.ctype)
				w.WriteHeader(c.status)
				io.WriteString(w, c.body(id))
			})
			outcome, te := secondCall(t, url)
			if calls.Load() != 2 || outcome == tools.NotSent || outcome == tools.Success {
				t.Fatalf("acted, then a proxy answered %d (%s): %d tools/call POSTs (want 2), %d effects; %v %+v", c.status, c.name, calls.Load(), effects.Load(), outcome, te)
			}
		})
	}
}

// A stateless server has no session to forget: a plain-text 400 on a reused
// session, after the tool acted, is its answer (definite), and the call is
// not sent again. Only a session with an ID can go stale.
func TestMCPPlainText400OnAReusedStatelessSessionIsNotSentAgain(t *testing.T) {
	t.Parallel()
	var effects, calls atomic.Int32
	url := statelessServer(t, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "create_ticket", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				effects.Add(1)
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ticket"}}}, nil
			})
	}, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, []byte(`"tools/call"`)) && calls.Add(1) == 2 {
				effects.Add(1) // acted, then refused by a filter in front of the server
				http.Error(w, "ticket refused by policy", http.StatusBadRequest)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	outcome, te := secondCall(t, url)
	if calls.Load() != 2 {
		t.Fatalf("a plain-text 400 on a reused stateless session was taken for a stale one: %d tools/call POSTs (want 2), %d effects; %v %+v", calls.Load(), effects.Load(), outcome, te)
	}
	if outcome != tools.Definite {
		t.Fatalf("a plain-text 400 from a stateless server: %v %+v, want definite", outcome, te)
	}
}

// A 2026-07-28 server that sheds load answers a tools/call with an empty
// inputRequests (SEP-2322: busy, retry later), before its tool acts. The
// SDK's multi-round-trip middleware sent the call again, three times in
// all, and then failed with an error of its own, which read as an answer
// lost after the call was sent: an unkeyed write went indeterminate
// although the server said, three times, that it did not run it.
func TestMCPCallAServerShedsIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	var effects, rounds atomic.Int32
	url := statelessServer(t, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "create_ticket", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				rounds.Add(1)
				return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{}}, nil // busy
			})
	}, nil)
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url, Tool: "create_ticket"}, 10*time.Second)
	_, outcome, te := callKeyed(t, tool, "key_1", `{}`)
	if outcome == tools.Ambiguous {
		t.Fatalf("a call the server shed %d times (%d effects) gave %v %+v: want not sent, retried later", rounds.Load(), effects.Load(), outcome, te)
	}
	if outcome != tools.NotSent {
		t.Fatalf("a call the server shed: %v %+v, want not sent", outcome, te)
	}
}

// An input_required result with a requestState and no inputRequests (a
// continuation a server answers while a step waits on something out of
// band, e.g. a URL-mode elicitation, after its first step acted) asks for
// input: ambiguous. It was taken for load shedding, not sent, although the
// tool acted. The SDK's own middleware takes only a present, empty
// inputRequests for shedding.
func TestMCPInputRequiredWithARequestStateAndNoInputRequestsIsNotBusy(t *testing.T) {
	t.Parallel()
	var effects atomic.Int32
	url := statelessServer(t, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "create_ticket", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ticket"}}}, nil
			})
	}, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			json.Unmarshal(body, &msg)
			if msg.Method == "tools/call" {
				effects.Add(1) // step one done; the rest waits for the user's confirmation
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(msg.ID)+`,"result":{"resultType":"input_required","requestState":"step=2"}}`)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url, Tool: "create_ticket"}, 10*time.Second)
	_, outcome, te := callKeyed(t, tool, "key_1", `{}`)
	if outcome == tools.NotSent {
		t.Fatalf("an input_required continuation (requestState only, %d effects) gave %v %+v: not sent, so sent again later", effects.Load(), outcome, te)
	}
	if outcome != tools.Ambiguous || te.Code != "mcp_input_required" {
		t.Fatalf("an input_required continuation: %v %+v, want ambiguous mcp_input_required", outcome, te)
	}
}

// A stateful Go SDK server, on a protocol before 2026-07-28 with toolq's
// client, turns a handler's empty InputRequests (busy) into an error of its
// own, code 0 ("the server is busy, retry later"). Code 0 promises nothing
// of whether a tool ran, so that busy is ambiguous (docs/tools.md): only a
// 2026-07-28 server's empty inputRequests is not sent.
func TestMCPBusyOfAServerOnAnOlderProtocolIsAmbiguous(t *testing.T) {
	t.Parallel()
	url := goSDKServer(t, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "create_ticket", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{}}, nil // busy
			})
	}, nil)
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: url, Tool: "create_ticket"}, 10*time.Second)
	_, outcome, te := callKeyed(t, tool, "key_1", `{}`)
	if outcome != tools.Ambiguous || te.Code != "jsonrpc_0" {
		t.Fatalf("a call a server on an older protocol shed: %v %+v, want ambiguous jsonrpc_0", outcome, te)
	}
}

// ---------------------------------------------------------------------------
// tools import

// `tools import` must write a file that loads (the acceptance: "tools import
// --mcp writes a registry that tools audit accepts") whatever harmless text
// a server lists. Three inputs break it: a multi-line description that
// starts with a tab (scalar() forces a literal block, which yaml.v3 writes
// but cannot read back), a control character in the server's name (written
// raw into the head comment), and U+0085 in a property name of the schema
// (json.Marshal writes it raw; yaml.Unmarshal of that JSON reads it as a
// line break in a key and fails, and the import aborts).
func TestMCPImportOfAnyToolListWritesAFileThatLoads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, serverName, description, propName string
	}{
		{"description starting with a tab", "srv", "\tUsage: pay an invoice\n\tthen wait", "amount"},
		{"control character in the server's name", "srv\x1b[31m", "Pay an invoice.", "amount"},
		{"NEL in a property name", "srv", "Pay an invoice.", "amount\u0085cents"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := mcp.NewServer(&mcp.Implementation{Name: tc.serverName, Version: "1"}, nil)
			srv.AddTool(&mcp.Tool{Name: "pay", Description: tc.description,
				InputSchema: json.RawMessage(`{"type":"object","properties":{` + strconv.Quote(tc.propName) + `:{"type":"integer"}}}`)},
				func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					return &mcp.CallToolResult{}, nil
				})
			ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
			defer ts.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			file, err := tools.ImportMCP(ctx, tools.MCP{URL: ts.URL}, nil)
			if err != nil {
				t.Fatalf("import failed: %v", err)
			}
			reg, err := tools.Parse(file, "imported.yaml", tools.Config{})
			if err != nil {
				t.Fatalf("the imported file does not load: %v\n%s", err, file)
			}
			reg.Close()
		})
	}
}
