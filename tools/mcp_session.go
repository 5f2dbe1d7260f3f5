package tools

// The MCP executor's sessions: a pool per server, and what each call learns
// of how far it got.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// sessionPool holds the open sessions with one MCP server.
//
// Over HTTP a session carries one call at a time, as an HTTP/1.1
// connection does: a stream cut in one call breaks that session alone,
// never the calls of others (whose outcome would then be unknown too).
// Idle sessions are kept for the next calls. A stdio server is one process
// and one session that every call shares; a session that failed is closed
// and the next call opens another (starts the server again).
type sessionPool struct {
	connect func(context.Context) (*mcp.ClientSession, error)
	shared  bool

	procs sync.Map // *mcp.ClientSession → the *exec.Cmd of its stdio server

	mu         sync.Mutex
	idle       []*mcp.ClientSession // !shared: sessions that served a call and may serve another
	one        *mcp.ClientSession   // shared: the session, once open
	connecting chan struct{}        // shared: closed when the attempt under way ends
	closed     bool
}

// maxIdleSessions bounds the idle sessions kept per server.
const maxIdleSessions = 64

func newSessionPool(connect func(context.Context) (*mcp.ClientSession, error), shared bool) *sessionPool {
	return &sessionPool{connect: connect, shared: shared}
}

// get returns a session for one call: an idle one, or over HTTP a new one
// when there is none or fresh is set; reused reports one that served calls
// before (and so may have gone stale on the server).
func (p *sessionPool) get(ctx context.Context, fresh bool) (s *mcp.ClientSession, reused bool, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, errPoolClosed
	}
	if p.shared {
		return p.getShared(ctx)
	}
	if n := len(p.idle); n > 0 && !fresh {
		s = p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return s, true, nil
	}
	p.mu.Unlock()
	s, err = p.connect(ctx)
	return s, false, err
}

// getShared returns the one session of a stdio server, opening it if no
// call is already doing so; a call waiting for another's attempt gives up
// when its ctx ends. Called with p.mu held; returns with it released.
func (p *sessionPool) getShared(ctx context.Context) (*mcp.ClientSession, bool, error) {
	for {
		switch {
		case p.closed:
			p.mu.Unlock()
			return nil, false, errPoolClosed
		case p.one != nil:
			s := p.one
			p.mu.Unlock()
			return s, true, nil
		case p.connecting != nil:
			wait := p.connecting
			p.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, false, ctx.Err()
			}
			p.mu.Lock()
			continue
		}
		done := make(chan struct{})
		p.connecting = done
		p.mu.Unlock()
		s, err := p.connect(ctx)
		p.mu.Lock()
		p.connecting = nil
		close(done)
		if err == nil && p.closed {
			p.mu.Unlock()
			s.Close()
			return nil, false, errPoolClosed
		}
		if err == nil {
			p.one = s
		}
		p.mu.Unlock()
		return s, false, err
	}
}

// put gives a session back after a call; one that is not healthy is closed.
func (p *sessionPool) put(s *mcp.ClientSession, healthy bool) {
	p.mu.Lock()
	switch {
	case p.shared && healthy:
		p.mu.Unlock()
		return
	case p.shared:
		if p.one == s {
			p.one = nil
		}
	case healthy && !p.closed && len(p.idle) < maxIdleSessions:
		p.idle = append(p.idle, s)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	go s.Close() // a session DELETE, or stopping a server: not on the call's path
}

// dropIdle closes the idle sessions, after the server refused one it no
// longer knew: it restarted, or expired that session, and the others were
// idle at least as long (the last one given back is taken first).
func (p *sessionPool) dropIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, s := range idle {
		go s.Close()
	}
}

// close ends every session; calls in flight end with their sessions.
func (p *sessionPool) close() error {
	p.mu.Lock()
	sessions := p.idle
	if p.one != nil {
		sessions = append(sessions, p.one)
	}
	p.idle, p.one, p.closed = nil, nil, true
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Go(func() { s.Close() })
	}
	wg.Wait()
	return nil
}

// shareMCPSessions has the MCP tools that reach one server with the same
// settings share one pool of sessions (one process, for a stdio server).
func shareMCPSessions(defs []Definition) {
	pools := map[string]*sessionPool{}
	for _, d := range defs {
		m, ok := d.Executor.(*MCP)
		if !ok {
			continue
		}
		if p, seen := pools[m.server()]; seen {
			m.pool = p
		} else {
			pools[m.server()] = m.pool
		}
	}
}

var errPoolClosed = &Error{Outcome: NotSent, Code: "closed", Message: "the MCP executor is closed"}

// mcpProgress is how far one tools/call got.
type mcpProgress struct {
	// sent: the call may have reached the server. Over HTTP, its request
	// had a connection (as the HTTP executor counts it); over stdio, it
	// was written to the server's stdin.
	sent atomic.Bool
	// keyed: the call carries its key, in _meta (and a header, over HTTP).
	keyed bool

	mu         sync.Mutex
	status     int // the HTTP status of the call's POST, once answered
	retryAfter int // its Retry-After in seconds, if any
	// wire is the JSON-RPC error a refused POST carried as its answer to
	// the call: a server on protocol 2026-07-28 sends invalid params as a
	// 400 and method not found as a 404, after its tool ran.
	wire *jsonrpc.Error
	// unanswered: the refused POST is a server's refusal of a session it
	// does not know (see unknownSession), which says nothing of the call.
	unanswered bool
}

func (p *mcpProgress) answer() (status int, retryAfter time.Duration, wire *jsonrpc.Error, unanswered bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status, time.Duration(p.retryAfter) * time.Second, p.wire, p.unanswered
}

// trackedTransport marks a tools/call written once its connection took it.
type trackedTransport struct{ mcp.Transport }

func (t trackedTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return trackedConn{c}, nil
}

type trackedConn struct{ mcp.Connection }

// Read marks its errors as the transport's: an error the SDK makes of a
// line it cannot take (a JSON-RPC message with no id, say) ends every call
// in flight, and is no answer of the server to any of them.
func (c trackedConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err != nil {
		return nil, &transportError{err}
	}
	return msg, nil
}

// transportError is an error of reading the connection.
type transportError struct{ err error }

func (e *transportError) Error() string { return e.err.Error() }
func (e *transportError) Unwrap() error { return e.err }

func (c trackedConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	err := c.Connection.Write(ctx, msg)
	if call := callOf(ctx); call != nil && err == nil {
		if r, ok := msg.(*jsonrpc.Request); ok && r.Method == "tools/call" {
			call.progress.sent.Store(true)
		}
	}
	return err
}

// mcpTransport is the HTTP round tripper of an MCP executor: it adds the
// configured headers and, on a tools/call, the key's header, and records
// how far the call got.
type mcpTransport struct {
	m    *MCP
	next http.RoundTripper
}

func (t mcpTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	for k, v := range t.m.Headers {
		r.Header.Set(k, v)
	}
	call := callOf(req.Context())
	if call == nil || req.Method != http.MethodPost || !mayBeToolsCall(req) {
		// The session's other requests, and a notifications/cancelled the
		// SDK sends in the call's context, carry no key and say nothing of
		// how far the call got.
		return t.next.RoundTrip(r)
	}
	if call.req.Key != "" && t.m.IdempotencyHeader != "-" {
		v := call.req.Key
		if t.m.IdempotencyForm == KeyStructured {
			v = strconv.Quote(v)
		}
		r.Header.Set(t.m.IdempotencyHeader, v)
	}
	p := call.progress
	mark := func() { p.sent.Store(true) }
	r = r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
		GotConn:      func(httptrace.GotConnInfo) { mark() },
		WroteHeaders: mark,
		WroteRequest: func(httptrace.WroteRequestInfo) { mark() },
	}))
	resp, err := t.next.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	var wire *jsonrpc.Error
	var unanswered bool
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		wire, unanswered = readRefusal(req, resp)
	}
	p.mu.Lock()
	p.status = resp.StatusCode
	p.retryAfter, _ = strconv.Atoi(resp.Header.Get("Retry-After"))
	p.wire = wire
	p.unanswered = unanswered
	p.mu.Unlock()
	return resp, nil
}

// maxErrorBody bounds what is read of a refused POST's body to find the
// call's answer in it.
const maxErrorBody = 64 << 10

// readRefusal reads a refused POST's body for what it says of the call:
// wire is the JSON-RPC error it carries as the call's answer (one JSON-RPC
// response with the call's id, as a number or as its string spelling);
// unanswered, that it is a server's refusal of a session it does not know
// (see unknownSession). Anything else, a body that is not read whole (cut
// short, over maxErrorBody) included, may be the call's answer in a form
// not read here, and is neither. The body is left whole for the SDK.
func readRefusal(req *http.Request, resp *http.Response) (wire *jsonrpc.Error, unanswered bool) {
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody+1))
	resp.Body = readCloser{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	if err != nil || len(head) > maxErrorBody {
		return nil, false
	}
	if unknownSession(resp.StatusCode, resp.Header.Get("Content-Type"), head) {
		return nil, true
	}
	call := callID(req)
	msg, ok := oneObject(head)
	if !ok || string(msg["jsonrpc"]) != `"2.0"` || call == "" {
		return nil, false
	}
	var id any
	dec := json.NewDecoder(bytes.NewReader(msg["id"]))
	dec.UseNumber()
	if dec.Decode(&id) != nil {
		return nil, false
	}
	var spelled string
	switch id := id.(type) {
	case string:
		spelled = id
	case json.Number:
		spelled = id.String()
	}
	if spelled != call {
		return nil, false
	}
	if err := json.Unmarshal(msg["error"], &wire); err != nil || wire == nil {
		return nil, false
	}
	return wire, false
}

// unknownSession reports whether a refused POST, its body read whole, is
// an SDK's refusal of a session it does not know, sent before any tool
// runs:
//   - a 404 (the status the MCP transport gives an unknown session) with
//     the Go SDK's plain text ("session not found", or "session is
//     closing"), or exactly one JSON-RPC error and nothing else whose id is
//     null (the TypeScript SDK) or "server-error" (the Python SDK);
//   - a 400 with exactly one JSON-RPC error and nothing else, its id null
//     or left out, code -32000 and message "Bad Request: No valid session
//     ID provided": the TypeScript SDK's example servers and the reference
//     server answer so a session they do not know (after a restart).
//
// Nothing else is told from the call's answer: a proxy's or gateway's
// page, in any status, may have replaced the server's answer after the
// tool acted.
func unknownSession(status int, contentType string, body []byte) bool {
	switch status {
	case http.StatusNotFound:
		if media, _, _ := mime.ParseMediaType(contentType); media == "text/plain" {
			text := string(bytes.TrimSuffix(body, []byte("\n")))
			return text == "session not found" || text == "session is closing"
		}
		id, _, ok := jsonrpcRefusal(body)
		return ok && (id == "null" || id == `"server-error"`)
	case http.StatusBadRequest:
		id, e, ok := jsonrpcRefusal(body)
		return ok && (id == "" || id == "null") && e.Code == -32000 && e.Message == "Bad Request: No valid session ID provided"
	}
	return false
}

// jsonrpcRefusal reads body as exactly one JSON-RPC error and nothing else
// (members jsonrpc "2.0", error and, if any, id): its id as written ("" if
// left out) and its error's code and message.
func jsonrpcRefusal(body []byte) (id string, e struct {
	Code    int64  `json:"code"`
	Message string `json:"message"`
}, ok bool) {
	msg, ok := oneObject(body)
	if !ok || string(msg["jsonrpc"]) != `"2.0"` || len(msg["error"]) == 0 || msg["error"][0] != '{' {
		return "", e, false
	}
	for name := range msg {
		if name != "jsonrpc" && name != "id" && name != "error" {
			return "", e, false
		}
	}
	if json.Unmarshal(msg["error"], &e) != nil {
		return "", e, false
	}
	return string(msg["id"]), e, true
}

// oneObject decodes body as exactly one JSON object, its members raw; ok
// is false for anything else: not an object, a member named twice, or
// data after it.
func oneObject(body []byte) (members map[string]json.RawMessage, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	members = map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		name, isName := t.(string)
		if err != nil || !isName {
			return nil, false
		}
		if _, twice := members[name]; twice {
			return nil, false
		}
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return nil, false
		}
		members[name] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return members, true
}

// callID is the id of the request req sent, spelled as a string ("" if
// it cannot be read).
func callID(req *http.Request) string {
	if req.GetBody == nil {
		return ""
	}
	body, err := req.GetBody()
	if err != nil {
		return ""
	}
	defer body.Close()
	sent, err := io.ReadAll(body)
	if err != nil {
		return ""
	}
	msg, err := jsonrpc.DecodeMessage(sent)
	r, ok := msg.(*jsonrpc.Request)
	if err != nil || !ok {
		return ""
	}
	switch id := r.ID.Raw().(type) {
	case int64:
		return strconv.FormatInt(id, 10)
	case string:
		return id
	}
	return ""
}

type readCloser struct {
	io.Reader
	io.Closer
}

// mayBeToolsCall reports whether an SDK request may be a tools/call: it is,
// unless the head of its body names another method. The SDK writes
// "method" before "params", so the scan stops there and reads none of a
// large call's args; a body it cannot read counts as a call, since taking
// a call for another request would lose that it was sent.
func mayBeToolsCall(req *http.Request) bool {
	if req.GetBody == nil {
		return true
	}
	body, err := req.GetBody()
	if err != nil {
		return true
	}
	defer body.Close()
	method, ok := methodOf(json.NewDecoder(body))
	return !ok || method == "tools/call"
}

// methodOf reads a JSON-RPC message's "method" member, skipping those
// before it; ok is false when there is none or the message is not JSON.
func methodOf(dec *json.Decoder) (method string, ok bool) {
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", false
	}
	for dec.More() {
		name, err := dec.Token()
		if err != nil {
			return "", false
		}
		if name == "method" {
			return method, dec.Decode(&method) == nil
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return "", false
		}
	}
	return "", false
}
