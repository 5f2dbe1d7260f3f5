// Package mcpfront serves a tool registry as an MCP server over Streamable
// HTTP, so that an agent written in any language, with any MCP client, has
// its tool calls made once.
//
// A tools/call whose _meta carries io.toolq/conversation_id and
// io.toolq/turn_index (and, optionally, io.toolq/ordinal) becomes a job
// whose key is derived as always, from those fields, the tool and the
// arguments; the response is the job's result. An MCP client whose
// response stream breaks loses the request in flight and must send it
// again as a new request, with a new request ID: that request carries the
// same _meta and arguments, hence the same key, and gets the stored result
// instead of a second effect.
//
// A write tool called without those fields is refused with a JSON-RPC
// error (invalid params) that names them: the turn index is what keeps a
// deliberate second call in a later turn from being taken for a re-issue,
// so it is never guessed. A read tool called without them runs at once in
// this process, as the worker runs reads (no key, no ledger, no job).
//
//	front, err := mcpfront.New(mcpfront.Config{Registry: reg, JS: js})
//	defer front.Close()
//	mux.Handle("/mcp", front.Handler())
package mcpfront

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/version"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
)

// The names toolq reads in a tools/call's _meta, and writes in its
// result's.
const (
	// MetaConversationID is the conversation the call belongs to (a string
	// matching ^[A-Za-z0-9_:-]{1,128}$).
	MetaConversationID = "io.toolq/conversation_id"
	// MetaTurnIndex is the index of the assistant turn that made the call
	// (an integer ≥ 0): the same for a re-issue, another for a new call.
	MetaTurnIndex = "io.toolq/turn_index"
	// MetaOrdinal tells identical calls of one turn apart (0, 1, …;
	// absent: 0).
	MetaOrdinal = "io.toolq/ordinal"
	// MetaKey, in a result, is the call's key (for `consumer ledger show`).
	MetaKey = "io.toolq/key"
	// MetaStatus, in a result, is the call's status: ok, error, rejected,
	// indeterminate, or for a call that needs a person's approval
	// awaiting_approval (not final: the same call sent again later gets its
	// final result), denied or expired.
	MetaStatus = "io.toolq/status"
	// MetaApproval, in the result of a call that needed a person's
	// approval, is that approval: group, requested_at, expires_at,
	// args_digest, and once decided decision, decided_by, reason and
	// decided_at.
	MetaApproval = "io.toolq/approval"
	// MetaClass, in a tool's description, is its class: read,
	// keyed_write, unkeyed_write or transactional_write.
	MetaClass = "io.toolq/class"
)

// metaPrefix starts every name toolq reads in _meta: a request's other
// io.toolq/ names (a misspelt ordinal) are refused, not ignored.
const metaPrefix = "io.toolq/"

// CodeNoResultYet is the JSON-RPC error code of a call that has no result
// within Config.Wait, or whose wait the server's end cut short: it is
// queued or running, and the same tools/call sent again gets its result.
// It is also the code of a call an operator resolved as not run, whose
// message says when the same call sent again runs.
const CodeNoResultYet = -32001

// DefaultWait is Config.Wait's default: below the 60 s after which MCP
// clients commonly give up on a request, so that the client reads why.
const DefaultWait = 50 * time.Second

// Config configures a Server.
type Config struct {
	// Registry is the tools served (required).
	Registry *tools.Registry
	// JS publishes the jobs and reads their results (required). The
	// streams must exist: the consumer provisions them at start.
	JS jetstream.JetStream
	// Logger receives what goes wrong beside the calls (nil: slog.Default()).
	Logger *slog.Logger
	// Wait is how long a call waits for its result before the client is
	// told to send it again (default DefaultWait).
	Wait time.Duration
	// MaxBodySize refuses a call whose job would be larger, in bytes: the
	// workers dead-letter such a job instead of running it (0: no limit).
	MaxBodySize int
}

func (c Config) withDefaults() (Config, error) {
	if c.Registry == nil {
		return c, errors.New("mcpfront: Config.Registry is required")
	}
	if c.JS == nil {
		return c, errors.New("mcpfront: Config.JS is required")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Wait <= 0 {
		c.Wait = DefaultWait
	}
	return c, nil
}

// Server is the MCP front door of one registry. Its methods are safe for
// concurrent use.
type Server struct {
	cfg     Config
	client  *jobs.Client
	mcp     *mcp.Server
	handler http.Handler

	ctx    context.Context // ends at Close: the calls still waiting end
	cancel context.CancelFunc

	mu      sync.Mutex
	flights map[string]*flight // the calls waiting for their result, by key
	closed  bool

	readerMu sync.Mutex
	reader   *jobs.Results // the results of every conversation; nil until the first call, or after it stopped
}

// New returns the front door of cfg.Registry. A tool whose schema cannot
// describe an object (tools.Tool.InputSchema: the args of every call are
// one), or that the MCP SDK refuses, is left out, with a warning. Errors: a Config without Registry or
// JS.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, client: jobs.NewClient(cfg.JS), flights: map[string]*flight{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "toolq", Version: version.Get().Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       cfg.Logger,
	})
	for _, t := range cfg.Registry.Tools() {
		schema, err := t.InputSchema()
		if err != nil {
			cfg.Logger.Warn("tool left out of the MCP server", "tool", t.Name, "error", err)
			continue
		}
		if err := s.addTool(t, schema); err != nil {
			cfg.Logger.Warn("tool left out of the MCP server", "tool", t.Name, "error", err)
		}
	}
	// Stateless: no session to lose. A client that re-issues a call after a
	// cut may come back on a new connection, to another consumer behind
	// the same address; the key, not the session, makes it the same call.
	s.handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{Stateless: true, Logger: cfg.Logger})
	return s, nil
}

// addTool serves t. The SDK panics on a schema it refuses (an
// x-mcp-header annotation on a property it cannot bind to a header) that
// the registry takes: that panic is the tool's error, not the server's end.
func (s *Server) addTool(t *tools.Tool, schema json.RawMessage) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("mcpfront: the MCP SDK refuses the tool's schema: %v", p)
		}
	}()
	s.mcp.AddTool(&mcp.Tool{
		Name:        t.Name,
		Description: t.Description,
		InputSchema: schema,
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: t.Class == tools.Read},
		Meta:        mcp.Meta{MetaClass: string(t.Class)},
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return s.call(ctx, t, req)
	})
	return nil
}

const instructions = "Calls of write tools are made once through toolq: each tools/call carries in _meta " +
	`"` + MetaConversationID + `" (the conversation) and "` + MetaTurnIndex + `" (the index of the assistant turn that made the call), ` +
	`and "` + MetaOrdinal + `" (0, 1, …) to tell identical calls of one turn apart. ` +
	"A call sent again with the same fields and arguments (after a broken stream) gets the first result; " +
	"the same call in a later turn is a new call. Read tools run without them. " +
	`A call that needs a person's approval is answered at once, not as an error, with "` + MetaStatus + `": "awaiting_approval": ` +
	"it has not run; the same call sent again later gets its final result once a person decided."

// Handler is the Streamable HTTP endpoint, to mount at /mcp.
func (s *Server) Handler() http.Handler { return s.handler }

// Close ends the calls still waiting for their results (their clients are
// told to send them again: the jobs stay queued) and stops reading
// results. It is idempotent. Stop the HTTP server first.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.readerMu.Lock()
	reader := s.reader
	s.reader = nil
	s.readerMu.Unlock()
	if reader != nil {
		reader.Close()
	}
}
