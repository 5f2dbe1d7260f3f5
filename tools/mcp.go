package tools

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/net/http/httpguts"

	"github.com/toolq/toolq/internal/version"
)

// MetaIdempotencyKey is the member of a tools/call request's _meta that
// carries the call's idempotency key to an MCP server.
const MetaIdempotencyKey = "io.toolq/idempotency-key"

// MCP is the executor of a tool that is a tool of an MCP server, reached
// over Streamable HTTP (URL) or by starting it and speaking over its stdin
// and stdout (Command). The args are the tools/call arguments; write tools
// send their key in the request's _meta (MetaIdempotencyKey) and, over
// HTTP, in a header.
type MCP struct {
	// URL is the server's Streamable HTTP endpoint (http:// or https://).
	URL string
	// Command starts a local server that speaks MCP over stdio: the program
	// and its arguments.
	Command []string
	// Env is the environment a Command server starts with, on top of
	// HOME, LOGNAME, PATH, SHELL, TERM, USER and the locale (LANG, LC_*,
	// TZ, TMPDIR) of the consumer's: a server does not inherit the
	// consumer's credentials (DATABASE_URL, NATS_*) unless InheritEnv.
	Env map[string]string
	// InheritEnv gives a Command server the consumer's whole environment.
	InheritEnv bool
	// Headers are sent with every HTTP request; values may hold secrets.
	Headers map[string]string
	// Tool is the tool's name on the server (default: the registry's name).
	Tool string
	// IdempotencyHeader names the HTTP header the key is also sent in
	// ("Idempotency-Key" when empty; "-" sends it in _meta only).
	IdempotencyHeader string
	// IdempotencyForm is how the key is written in its header: structured
	// (an RFC 8941 string, the default) or raw.
	IdempotencyForm  string
	MaxResponseBytes int64 // the output's limit (default 1 MiB)
	// IsError is what a result with isError: true means: "definite" (the
	// default: the tool answered no, as MCP reports tool errors) or
	// "ambiguous", for a server whose tools may fail after acting (the
	// official SDKs turn any error of a handler into isError).
	IsError string
	// Client sends the HTTP requests (default: one with IdleConnsPerHost
	// idle connections).
	Client *http.Client

	pool    *sessionPool
	secrets secrets         // the values of the registry's ${…} references (see Load)
	stderr  *sync.WaitGroup // the copies of stdio servers' standard error
}

// MCPExecutor checks m and returns a copy with its defaults filled and its
// pool of sessions made (sessions are opened on the first call). It fails
// unless exactly one of URL and Command is given, for a URL that is not
// absolute http(s), and for a bad header name or form.
func MCPExecutor(m MCP) (*MCP, error) {
	switch {
	case m.URL != "" && len(m.Command) > 0:
		return nil, errors.New("url and command: a server is reached one way (url: Streamable HTTP, command: stdio)")
	case m.URL == "" && len(m.Command) == 0:
		return nil, errors.New("missing server: give url (Streamable HTTP) or command (stdio)")
	case m.URL != "":
		u, err := url.Parse(m.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("url %q: want an absolute http:// or https:// URL", m.secrets.redact(m.URL))
		}
	case m.Command[0] == "":
		return nil, errors.New("command: the first word is the program to start")
	}
	if m.Tool == "" {
		return nil, errors.New("tool: missing: the tool's name on the server")
	}
	if len(m.Command) > 0 && (len(m.Headers) > 0 || m.IdempotencyHeader != "" || m.IdempotencyForm != "") {
		return nil, errors.New("headers, idempotency_header and idempotency_form are for url: a stdio server gets the key in _meta only")
	}
	if len(m.Env) > 0 && m.URL != "" {
		return nil, errors.New("env is for command: a server at a url has its own environment")
	}
	switch m.IsError {
	case "":
		m.IsError = "definite"
	case "definite", "ambiguous":
	default:
		return nil, fmt.Errorf("is_error %q: want definite or ambiguous", m.IsError)
	}
	if m.InheritEnv && m.URL != "" {
		return nil, errors.New("inherit_env is for command: a server at a url has its own environment")
	}
	switch m.IdempotencyForm {
	case "":
		m.IdempotencyForm = KeyStructured
	case KeyStructured, KeyRaw:
	default:
		return nil, fmt.Errorf("idempotency_form %q: want structured (an RFC 8941 string) or raw (the bare key)", m.IdempotencyForm)
	}
	switch {
	case m.URL == "":
	case m.IdempotencyHeader == "":
		m.IdempotencyHeader = "Idempotency-Key"
	case m.IdempotencyHeader != "-" && !httpguts.ValidHeaderFieldName(m.IdempotencyHeader):
		return nil, fmt.Errorf("idempotency_header %q: not a valid header name", m.IdempotencyHeader)
	case m.IdempotencyHeader != "-" && reservedHeader[http.CanonicalHeaderKey(m.IdempotencyHeader)]:
		return nil, fmt.Errorf("idempotency_header %q: HTTP itself writes that header: name another", m.IdempotencyHeader)
	}
	for k := range m.Headers {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, fmt.Errorf("headers: %q is not a valid header name", k)
		}
	}
	if m.MaxResponseBytes <= 0 {
		m.MaxResponseBytes = DefaultMaxResponse
	}
	if m.URL != "" {
		client := m.Client
		if client == nil {
			client = &http.Client{Transport: keepAliveTransport()}
		}
		next := client.Transport
		if next == nil {
			next = http.DefaultTransport
		}
		c := *client
		c.Transport = mcpTransport{m: &m, next: noReplay{next: next}}
		m.Client = &c
	}
	m.stderr = new(sync.WaitGroup)
	m.pool = newSessionPool(m.connect, m.URL == "")
	return &m, nil
}

// Downstream is the server the executor calls, the unit of circuit
// breaking: its origin and path, or the command that starts it, the
// secrets in them redacted.
func (m *MCP) Downstream() string {
	if m.URL != "" {
		u, _ := url.Parse(m.URL)
		return "mcp:" + u.Scheme + "://" + u.Host + m.secrets.redact(u.EscapedPath())
	}
	return "mcp:stdio:" + m.secrets.redact(strings.Join(m.Command, " "))
}

// Server is what the executor's sessions connect to, for sharing: tools of
// one server with the same settings share one pool of sessions (see Load).
func (m *MCP) server() string {
	env, _ := json.Marshal(m.Env)
	headers, _ := json.Marshal(m.Headers)
	command, _ := json.Marshal(m.Command)
	return strings.Join([]string{m.URL, string(command), string(env), string(headers), m.IdempotencyHeader, m.IdempotencyForm,
		strconv.FormatBool(m.InheritEnv)}, "\x00")
}

// Close ends the executor's sessions (and stops a stdio server), and
// waits a little for what the server wrote to its standard error to be
// copied.
func (m *MCP) Close() error {
	err := m.pool.close()
	copied := make(chan struct{})
	go func() { m.stderr.Wait(); close(copied) }()
	select {
	case <-copied:
	case <-time.After(time.Second): // a child of the server may hold it open
	}
	return err
}

// mcpResumes is how many times a cut response stream is resumed.
const mcpResumes = 3

// connect opens a session with the server.
func (m *MCP) connect(ctx context.Context) (*mcp.ClientSession, error) {
	// The SDK's answering of a tool's requests for input is off: it has
	// nothing to answer them with, and it reads a server that sheds load as
	// an error indistinguishable from a lost answer (see classify).
	client := mcp.NewClient(&mcp.Implementation{Name: "toolq", Version: version.Get().Version},
		&mcp.ClientOptions{MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})
	if m.URL != "" {
		// Not wrapped: the SDK's own connection keeps the session's protocol
		// version for its headers; how far a call got is traced by
		// mcpTransport.
		//
		// A response stream cut mid-call is resumed with its Last-Event-ID
		// (the server may still answer it) at most mcpResumes times, 1 s,
		// 1.5 s and 2.25 s apart: the SDK's default of five, up to 13 s and
		// more on a loaded machine, holds a slot for a server that is gone.
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: m.URL, HTTPClient: m.Client, DisableStandaloneSSE: true, MaxRetries: mcpResumes}, nil)
	}
	cmd := exec.Command(m.Command[0], m.Command[1:]...)
	cmd.Env = serverEnv(m.Env, m.InheritEnv)
	// The server's standard error goes to the consumer's, line by line,
	// the secrets of its environment redacted: a server that fails to log
	// in often says with what.
	stderr, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = w
	m.stderr.Add(1)
	go func(out io.Writer) {
		defer m.stderr.Done()
		m.secrets.copyLines(out, stderr)
		stderr.Close()
	}(os.Stderr)
	s, err := client.Connect(ctx, trackedTransport{&mcp.CommandTransport{Command: cmd, TerminateDuration: time.Second}}, nil)
	w.Close() // the server has its own; the copy ends when the server's closes
	if err == nil {
		m.pool.procs.Store(s, cmd)
	}
	return s, err
}

// inheritedEnv are the variables a stdio server gets from the consumer's
// environment: what a program needs to run, never the consumer's
// credentials.
var inheritedEnv = []string{"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "TZ", "TMPDIR"}

// serverEnv is the environment of a stdio server.
func serverEnv(extra map[string]string, inherit bool) []string {
	var env []string
	if inherit {
		env = os.Environ()
	} else {
		for _, kv := range os.Environ() {
			name, _, _ := strings.Cut(kv, "=")
			if slices.Contains(inheritedEnv, name) || strings.HasPrefix(name, "LC_") {
				env = append(env, kv)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		env = append(env, k+"="+extra[k])
	}
	return env
}

// Execute sends one tools/call and classifies what happened:
//
//	no session could be opened; the call not written                      → NotSent
//	its POST answered 429, or 503 with Retry-After                        → NotSent, retry after that
//	its POST answered 404, on a session with an ID that served calls
//	before (the server restarted, or expired the session), with an SDK's
//	refusal of an unknown session as its body, read whole (at most 64
//	KiB): "session not found" or "session is closing" in plain text, or
//	one JSON-RPC error with id null or "server-error"                     → NotSent, and sent on a new session
//	its POST answered 400, 401, 403 or 404 on such a session with any
//	other body (a proxy's page, too large, cut short, a JSON-RPC
//	response with another id than the call's)                             → Ambiguous
//	its POST answered 409 to a call that carried its key                  → Ambiguous, retry after Retry-After
//	its POST answered another 4xx (but 408)                               → Definite: the server refused it
//	its POST answered 408 or 5xx                                          → Ambiguous
//	a JSON-RPC error in the response to the call (in a 2xx, or as the
//	body of any other status, with the call's id or its string spelling:
//	protocol 2026-07-28 sends invalid params as a 400 and method not
//	found as a 404, after the tool ran): parse error, invalid request,
//	method not found, invalid params (-32700, -32600…-32602)              → Definite
//	any other JSON-RPC error (internal, server, application, code 0:
//	an older server's busy among them)                                    → Ambiguous: the tool may have run
//	a result saying the server is busy (protocol 2026-07-28: an
//	inputRequests present and empty)                                      → NotSent, retry later
//	a result asking for input (elicitation, roots, sampling; or
//	input_required with no inputRequests)                                 → Ambiguous: the tool may have acted first
//	a result with isError: true                                           → Definite (IsError "ambiguous": Ambiguous)
//	a stream cut (its resume refused too), a timeout or the server gone
//	once the call was written                                             → Ambiguous
//	a result                                                              → Success
//
// A stdio server that does not read the call within a second after the
// timeout is killed (a partial line can never complete): the call was not
// sent.
func (m *MCP) Execute(ctx context.Context, req Request) (json.RawMessage, error) {
	out, err := m.callOnce(ctx, req, false)
	var te *Error
	if errors.As(err, &te) && te.Code == codeSessionGone && ctx.Err() == nil {
		// The server forgot the session, and the idle ones with it: the call
		// goes once more on a session opened now.
		m.pool.dropIdle()
		out, err = m.callOnce(ctx, req, true)
	}
	return m.secrets.redactJSON(out), m.secrets.redactError(err)
}

// codeSessionGone: the server refused the call's session, which it knew
// no more (see Execute).
const codeSessionGone = "mcp_session_gone"

// callOnce sends the call on one session (a new one if fresh).
func (m *MCP) callOnce(ctx context.Context, req Request, fresh bool) (json.RawMessage, error) {
	s, reused, err := m.pool.get(ctx, fresh)
	if err != nil {
		return nil, NotSentError("mcp_connect", "could not open a session with the MCP server: "+oneLine(err.Error()), 0, err)
	}
	p := &mcpProgress{keyed: req.Key != ""}
	params := &mcp.CallToolParams{Name: m.Tool, Arguments: req.Args}
	if req.Key != "" {
		params.Meta = mcp.Meta{MetaIdempotencyKey: req.Key}
	}
	stop := m.killIfStuck(ctx, s)
	res, callErr := s.CallTool(context.WithValue(ctx, mcpCallKey{}, &mcpCall{req: req, progress: p}), params)
	stop()
	// Only a session with an ID can be forgotten by its server; a 4xx on
	// one without (protocol 2026-07-28, a stateless server) is an answer.
	stale := reused && s.ID() != ""
	out, err := m.classify(res, callErr, p, stale, ctx)
	m.pool.put(s, healthy(err))
	if !healthy(err) {
		m.pool.procs.Delete(s)
	}
	return out, err
}

// killIfStuck kills a stdio server whose call has not returned a second
// after ctx ended: a server that stopped reading its stdin blocks the
// write of a large call, which no context interrupts. The returned func
// disarms it.
func (m *MCP) killIfStuck(ctx context.Context, s *mcp.ClientSession) (stop func()) {
	v, ok := m.pool.procs.Load(s)
	if !ok {
		return func() {}
	}
	cmd := v.(*exec.Cmd)
	var mu sync.Mutex
	var timer *time.Timer
	stopped := false
	after := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			timer = time.AfterFunc(time.Second, func() { cmd.Process.Kill() })
		}
	})
	return func() {
		after()
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		if timer != nil {
			timer.Stop()
		}
	}
}

// healthy reports whether a session that gave err can serve the next call:
// the server answered the call (a result, a JSON-RPC error, busy, or a
// request for input). After a transport failure, a refused POST or a
// timeout it is closed.
func healthy(err error) bool {
	var te *Error
	switch {
	case err == nil:
		return true
	case errors.As(err, &te):
		return te.Code == codeToolError || te.Code == codeBusy || te.Code == codeInputRequired || strings.HasPrefix(te.Code, "jsonrpc_")
	}
	return false
}

const (
	codeToolError     = "mcp_tool_error"     // a result with isError
	codeBusy          = "mcp_busy"           // a server shedding load
	codeInputRequired = "mcp_input_required" // a tool asking for input
)

// classify maps what CallTool returned to an outcome (see Execute).
func (m *MCP) classify(res *mcp.CallToolResult, err error, p *mcpProgress, stale bool, ctx context.Context) (json.RawMessage, error) {
	if err != nil {
		return nil, m.classifyError(err, p, stale, ctx)
	}
	if res.NeedsInput() && res.InputRequests != nil && len(res.InputRequests) == 0 {
		// Load shedding (protocol 2026-07-28): an inputRequests present and
		// empty, as the SDK's own middleware reads it; the server is busy
		// and did not run the tool. Without one (a requestState alone: a
		// step of the tool waits on something else) it asks for input.
		return nil, NotSentError(codeBusy, "the MCP server is busy: retry later", DefaultNotSentDelay, nil)
	}
	if res.NeedsInput() {
		return nil, AmbiguousError(codeInputRequired, "the MCP tool asked for input (elicitation, roots or sampling), which toolq cannot give, and may have acted before asking", 0, nil)
	}
	if res.IsError {
		msg := m.secrets.snippet([]byte(contentText(res.Content)))
		if m.IsError == "ambiguous" {
			return nil, AmbiguousError(codeToolError, "the MCP tool reported an error, which may have come after it acted: "+msg, 0, nil)
		}
		return nil, DefiniteError(codeToolError, msg)
	}
	var out []byte
	if res.StructuredContent != nil {
		out, err = json.Marshal(res.StructuredContent)
	} else {
		content := res.Content
		if content == nil {
			content = []mcp.Content{}
		}
		out, err = json.Marshal(content)
	}
	if err != nil {
		return nil, AmbiguousError("invalid_output", "the MCP server's result cannot be written as JSON: "+err.Error(), 0, err)
	}
	if int64(len(out)) > m.MaxResponseBytes {
		// The effect happened; only its description is too large to carry.
		return json.RawMessage(fmt.Sprintf(`{"response_too_large":true,"limit_bytes":%d}`, m.MaxResponseBytes)), nil
	}
	return out, nil
}

func (m *MCP) classifyError(err error, p *mcpProgress, stale bool, ctx context.Context) error {
	status, retry, answered, unanswered := p.answer()
	refused := status != 0 && (status < 200 || status > 299)
	code := "http_" + strconv.Itoa(status)
	switch {
	case refused && status == http.StatusTooManyRequests:
		return NotSentError(code, oneLine(err.Error()), max(retry, DefaultNotSentDelay), err)
	case refused && status == http.StatusServiceUnavailable && retry > 0:
		return NotSentError(code, oneLine(err.Error()), retry, err)
	case refused && answered != nil:
		// The server's answer to the call, classified below as in a 2xx.
	case refused && stale && (status == http.StatusBadRequest || status == http.StatusUnauthorized || status == http.StatusForbidden || status == http.StatusNotFound):
		if unanswered {
			return NotSentError(codeSessionGone, "the MCP server refused the session (HTTP "+strconv.Itoa(status)+"): "+oneLine(err.Error()), 0, err)
		}
		// Any other refusal (a proxy's or gateway's page, in any of these
		// statuses, a body cut short or too large to read, a response with
		// another id, JSON-RPC in another form than one plain response)
		// may stand for the call's answer: the server may have known the
		// session, and run the tool.
		return AmbiguousError(code, "the MCP server refused the call, in a body that may be its answer after the tool ran: "+oneLine(err.Error()), 0, err)
	case refused && status == http.StatusConflict && p.keyed:
		// An idempotency layer in front of the server holds the key: the
		// first request under it is still in flight, as for the http executor.
		return AmbiguousError(code, "the same key is still being processed downstream: "+oneLine(err.Error()), cmp.Or(retry, DefaultNotSentDelay), err)
	case refused && status >= 400 && status < 500 && status != http.StatusRequestTimeout:
		return &Error{Outcome: Definite, Code: code, Message: "the MCP server refused the call: " + oneLine(err.Error()), Err: err}
	case refused:
		return AmbiguousError(code, "the MCP server failed while handling the call, which may have taken effect: "+oneLine(err.Error()), 0, err)
	}
	if wire := cmp.Or(answered, serverError(err)); wire != nil {
		code := "jsonrpc_" + strconv.FormatInt(wire.Code, 10)
		msg := oneLine(wire.Message)
		switch wire.Code {
		case jsonrpc.CodeParseError, jsonrpc.CodeInvalidRequest, jsonrpc.CodeMethodNotFound, jsonrpc.CodeInvalidParams:
			return &Error{Outcome: Definite, Code: code, Message: msg, Err: err}
		}
		return AmbiguousError(code, "the MCP server failed while handling the call, which may have taken effect: "+msg, 0, err)
	}
	switch {
	case !p.sent.Load():
		return NotSentError("not_sent", "the call was not sent to the MCP server: "+oneLine(err.Error()), 0, err)
	case ctx.Err() != nil:
		return AmbiguousError(CodeTimeout, "no answer from the MCP server after the call was sent: "+oneLine(err.Error()), 0, err)
	default:
		return AmbiguousError("connection_lost", "the MCP server's answer was lost after the call was sent: "+oneLine(err.Error()), 0, err)
	}
}

// The codes of the errors the SDK's JSON-RPC layer makes itself, for a
// connection that broke or closed: not answers of the server.
const (
	codeClientClosing = -32003
	codeServerClosing = -32004
	codeRejected      = -32005 // "rejected by transport"
)

// serverError is the JSON-RPC error the server answered to the call, if
// err is one. The SDK returns the error of the call's response wrapped
// once ("calling %q: %w"); a JSON-RPC error deeper in err is no answer to
// the call: the body of a refused request the SDK decoded (the GET that
// resumes a cut stream, answered "Session not found" by a server that
// restarted after acting), or an error of reading the connection (a
// transportError). Nor is one the SDK made itself for a connection that
// closed.
func serverError(err error) *jsonrpc.Error {
	wire, ok := errors.Unwrap(err).(*jsonrpc.Error)
	if !ok {
		return nil
	}
	switch wire.Code {
	case codeClientClosing, codeServerClosing, codeRejected:
		return nil
	}
	return wire
}

// contentText is the text of a result's text blocks.
func contentText(content []mcp.Content) string {
	var parts []string
	for _, c := range content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	if len(parts) == 0 {
		return "the MCP tool reported an error"
	}
	return strings.Join(parts, "\n")
}

// mcpCall is the call a request is made for, in its context.
type mcpCall struct {
	req      Request
	progress *mcpProgress
}

type mcpCallKey struct{}

// callOf is the call ctx is for, if any.
func callOf(ctx context.Context) *mcpCall {
	c, _ := ctx.Value(mcpCallKey{}).(*mcpCall)
	return c
}
