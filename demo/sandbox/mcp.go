package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolq/toolq/internal/jcs"
)

// MetaIdempotencyKey is where toolq puts a call's key in a tools/call
// request's _meta (the MCP server honours it, or the Idempotency-Key
// header).
const MetaIdempotencyKey = "io.toolq/idempotency-key"

// The sandbox's tools as an MCP server, with the effects and faults of the
// HTTP API:
//
//	send_payment   honours the key in _meta (MetaIdempotencyKey), or the
//	               Idempotency-Key header: same key and args → the first
//	               result again; other args → an error result; still in
//	               flight → JSON-RPC error -32001, to try again
//	create_ticket  no dedupe: a new ticket every time
//	search_orders  read-only
//
// A definite failure (error_rate) is a result with isError; a server error
// (server_error_rate) a JSON-RPC internal error, with no effect; after the
// effect (drop_after_effect_rate) the connection is reset, or a stdio
// server exits, without answering.
func (s *Server) mcpServer(exit func()) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "toolq-sandbox", Version: "1"}, nil)
	readOnly, write := &mcp.ToolAnnotations{ReadOnlyHint: true}, &mcp.ToolAnnotations{}
	srv.AddTool(&mcp.Tool{Name: "send_payment", Description: "Pay an invoice. Repeats of the idempotency key are collapsed.", Annotations: write,
		InputSchema: json.RawMessage(`{"type":"object","additionalProperties":false,"required":["invoice_id","amount_cents","currency"],` +
			`"properties":{"invoice_id":{"type":"string","minLength":1},"amount_cents":{"type":"integer","minimum":1},"currency":{"type":"string","pattern":"^[A-Z]{3}$"}}}`)},
		s.mcpTool(exit, func(ctx context.Context, call *mcp.CallToolRequest, body []byte, canonical string) answer {
			var req paymentRequest
			dec := json.NewDecoder(strings.NewReader(canonical))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil || req.InvoiceID == "" || req.AmountCents < 1 || !currencyPattern.MatchString(req.Currency) {
				return answer{status: http.StatusBadRequest, body: errorBody("invalid_request", "want {invoice_id: string, amount_cents: integer ≥ 1, currency: ISO 4217 code}")}
			}
			return s.pay(req, mcpKey(call), body, canonical, mcpLatency(call, s.Faults()))
		}))
	srv.AddTool(&mcp.Tool{Name: "create_ticket", Description: "Open a support ticket. No dedupe.", Annotations: write,
		InputSchema: json.RawMessage(`{"type":"object","additionalProperties":false,"required":["title"],"properties":{"title":{"type":"string","minLength":1},"body":{"type":"string"}}}`)},
		s.mcpTool(exit, func(ctx context.Context, call *mcp.CallToolRequest, body []byte, _ string) answer {
			var req ticketRequest
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil || req.Title == "" {
				return answer{status: http.StatusBadRequest, body: errorBody("invalid_request", "want {title: string, body: string}")}
			}
			return s.ticket(req, mcpKey(call), body, time.Now().UTC(), mcpLatency(call, s.Faults()))
		}))
	srv.AddTool(&mcp.Tool{Name: "search_orders", Description: "Find payments whose invoice id contains the query.", Annotations: readOnly,
		InputSchema: json.RawMessage(`{"type":"object","required":["query"],"properties":{"query":{"type":"string"}}}`)},
		s.mcpTool(exit, func(ctx context.Context, call *mcp.CallToolRequest, body []byte, _ string) answer {
			var q struct{ Query string }
			json.Unmarshal(body, &q)
			s.mu.Lock()
			matches := []Payment{}
			for _, p := range s.payments {
				if strings.Contains(p.InvoiceID, q.Query) {
					matches = append(matches, p)
				}
			}
			s.mu.Unlock()
			data, _ := json.Marshal(map[string]any{"query": q.Query, "data": matches})
			return answer{status: http.StatusOK, body: data}
		}))
	return srv
}

// mcpTool adapts one of the sandbox's writes to an MCP tool handler. exit
// drops the answer: it resets the HTTP connection, or ends a stdio server.
func (s *Server) mcpTool(exit func(), do func(ctx context.Context, call *mcp.CallToolRequest, body []byte, canonical string) answer) mcp.ToolHandler {
	return func(ctx context.Context, call *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		body := []byte(call.Params.Arguments)
		if len(body) == 0 {
			body = []byte("{}")
		}
		canonical, err := canonicalOf(body)
		if err != nil {
			return errorResult(errorBody("invalid_json", err.Error())), nil
		}
		a := do(ctx, call, bytes.Clone(body), canonical)
		switch {
		case a.drop || a.redirect != "":
			if exit != nil {
				exit()
			}
			if id := call.Extra.Header.Get(headerCall); id != "" {
				s.dropped.Store(id, true)
			}
			return textResult(a.body), nil
		case a.status == http.StatusConflict:
			return nil, &jsonrpc.Error{Code: -32002, Message: "a request with this key is still being processed: try again"}
		case a.status >= 500:
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: string(a.body)}
		case a.status >= 400:
			return errorResult(a.body), nil
		}
		return textResult(a.body), nil
	}
}

func textResult(body []byte) *mcp.CallToolResult {
	var structured any
	json.Unmarshal(body, &structured)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(body)}}, StructuredContent: structured}
}

func errorResult(body []byte) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(body)}}, IsError: true}
}

// mcpKey is the call's key: from _meta, else the Idempotency-Key header.
func mcpKey(call *mcp.CallToolRequest) string {
	if k, ok := call.Params.Meta[MetaIdempotencyKey].(string); ok {
		return k
	}
	if call.Extra != nil && call.Extra.Header != nil {
		r := &http.Request{Header: call.Extra.Header}
		k, _ := idempotencyKey(r)
		return k
	}
	return ""
}

// mcpLatency is how long a write takes: the Sandbox-Latency-Ms header of
// the request when there is one (HTTP), else the faults' latency.
func mcpLatency(call *mcp.CallToolRequest, f Faults) time.Duration {
	r := &http.Request{Header: http.Header{}}
	if call.Extra != nil && call.Extra.Header != nil {
		r.Header = call.Extra.Header
	}
	return latencyOf(r, f)
}

func canonicalOf(body []byte) (string, error) {
	canonical, err := jcs.CanonicalizeObject(body)
	if err != nil {
		return "", errors.New("arguments must be a JSON object: " + err.Error())
	}
	return string(canonical), nil
}

// headerCall names each HTTP request the MCP handler serves, so that a tool
// can have its answer dropped.
const headerCall = "Sandbox-Mcp-Call"

// mcpHandler serves the MCP server over Streamable HTTP; an answer a tool
// dropped resets the connection instead of being written.
func (s *Server) mcpHandler() http.Handler {
	srv := s.mcpServer(nil)
	inner := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{JSONResponse: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b [8]byte
		rand.Read(b[:])
		id := hex.EncodeToString(b[:])
		r.Header.Set(headerCall, id)
		defer s.dropped.Delete(id)
		inner.ServeHTTP(&droppingWriter{ResponseWriter: w, drop: func() bool { _, ok := s.dropped.Load(id); return ok }}, r)
	})
}

// droppingWriter resets the connection, instead of writing, once drop
// says so.
type droppingWriter struct {
	http.ResponseWriter
	drop    func() bool
	once    sync.Once
	dropped bool
}

func (d *droppingWriter) Write(p []byte) (int, error) {
	if d.check() {
		return 0, http.ErrHandlerTimeout
	}
	return d.ResponseWriter.Write(p)
}

func (d *droppingWriter) Flush() {
	if d.check() {
		return
	}
	if f, ok := d.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (d *droppingWriter) check() bool {
	if !d.dropped && d.drop() {
		d.once.Do(func() {
			d.dropped = true
			drop(d.ResponseWriter)
		})
	}
	return d.dropped
}

// ServeMCPStdio serves the sandbox's MCP server over stdin and stdout until
// the client goes away. An answer a tool drops ends the process at once
// (exit status 3), as a server that crashed after the effect.
func (s *Server) ServeMCPStdio(ctx context.Context) error {
	srv := s.mcpServer(func() { os.Exit(3) })
	return srv.Run(ctx, &mcp.StdioTransport{})
}
