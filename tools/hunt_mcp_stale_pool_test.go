package tools_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolq/toolq/tools"
)

// TestHuntMCPAfterARestartACallIsSentOnANewSessionNotAnotherStaleOne:
// docs/tools.md: a POST answered 400/401/403/404 on a session that served
// calls before is "not sent: sent once more, at once, on a new session".
// Execute's retry takes the next session from the pool, which after a
// restart of the server is as stale as the first whenever several calls ran
// at once before: the call comes back NotSent (a retry after the worker's
// delay) instead of being sent, and so does the next call, for as many
// sessions as the pool held.
func TestHuntMCPAfterARestartACallIsSentOnANewSessionNotAnotherStaleOne(t *testing.T) {
	t.Parallel()
	var known sync.Map
	var current atomic.Pointer[http.Handler]
	restart := func() {
		known.Clear()
		srv := mcp.NewServer(&mcp.Implementation{Name: "python-like", Version: "1"}, nil)
		srv.AddTool(&mcp.Tool{Name: "create_ticket", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				time.Sleep(300 * time.Millisecond)
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ticket"}}}, nil
			})
		var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
		current.Store(&h)
	}
	restart()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
			if _, ok := known.Load(sid); !ok {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				io.WriteString(w, `{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Session not found"}}`)
				return
			}
		}
		(*current.Load()).ServeHTTP(sessionRecorder{w, &known}, r)
	}))
	t.Cleanup(ts.Close)
	tool := mcpTool(t, tools.UnkeyedWrite, tools.MCP{URL: ts.URL, Tool: "create_ticket"}, 10*time.Second)
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
