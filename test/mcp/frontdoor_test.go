package mcp_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/mcpfront"
	"github.com/toolq/toolq/worker"
)

// frontDoor starts NATS, a ledger, the demo registry and its sandbox, a
// worker, and the MCP front door of the registry, all stopped when the
// test ends; it returns the stack and the front door's host:port.
func frontDoor(t *testing.T) (*embedded.Stack, string) {
	t.Helper()
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := embedded.Start(ctx, embedded.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, err := st.StartWorker(ctx, worker.Config{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	front, err := mcpfront.New(mcpfront.Config{Registry: st.Tools, JS: st.JS, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", front.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { srv.Close(); front.Close() })
	return st, strings.TrimPrefix(srv.URL, "http://")
}

// nodeScript is the path of a script of this folder, run with node, or a
// loud skip (a failure in CI) when node or the npm packages are missing.
func nodeScript(t *testing.T, name string) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		testenv.Missing(t, "node is not installed: the TypeScript MCP client needs it")
	}
	if _, err := os.Stat("node_modules/@modelcontextprotocol/sdk/package.json"); err != nil {
		testenv.Missing(t, "test/mcp's npm packages are not installed (make test-mcp-deps): %v", err)
	}
	script, err := filepath.Abs(name)
	if err != nil {
		t.Fatal(err)
	}
	return script
}

// TestTheTypeScriptClientsReissueAfterACutStreamPaysOnce: the official
// TypeScript MCP client calls a payment through the front door; a proxy
// cuts the response stream after the request was sent, the client sends
// the call again as a new request, then again on a new connection: one
// payment, the same result twice, and a call without _meta refused with a
// message that names the fields.
func TestTheTypeScriptClientsReissueAfterACutStreamPaysOnce(t *testing.T) {
	t.Parallel()
	script := nodeScript(t, "frontdoor-client.mjs")
	st, addr := frontDoor(t)
	proxy := testenv.StartCutProxy(t, addr)
	proxy.CutResponse(`"tools/call"`)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script, "http://"+proxy.Addr()+"/mcp", "inv_ts", "conv-ts", "4")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var seen struct {
		Cut      json.RawMessage `json:"cut"`
		CutError string          `json:"cutError"`
		Reissued json.RawMessage `json:"reissued"`
		Again    json.RawMessage `json:"again"`
		Unnamed  json.RawMessage `json:"unnamed"`
		Refusal  struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"refusal"`
	}
	if err := json.Unmarshal(out, &seen); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	switch {
	case proxy.Cuts() != 1 || seen.CutError == "" || seen.Cut != nil:
		t.Fatalf("the first call was not cut (%d cuts): %s", proxy.Cuts(), out)
	case !strings.Contains(string(seen.Reissued), `"io.toolq/status":"ok"`) || !strings.Contains(string(seen.Reissued), `"invoice_id":"inv_ts"`):
		t.Fatalf("re-issue: %s", seen.Reissued)
	case string(seen.Again) != string(seen.Reissued):
		t.Fatalf("the same call answered\n%s\nthen\n%s", seen.Reissued, seen.Again)
	case seen.Unnamed != nil || seen.Refusal.Code != -32602 ||
		!strings.Contains(seen.Refusal.Message, mcpfront.MetaConversationID) || !strings.Contains(seen.Refusal.Message, mcpfront.MetaTurnIndex):
		t.Fatalf("a write without _meta: %s", out)
	}
	n := 0
	for _, p := range st.Sandbox.Payments() {
		if p.InvoiceID == "inv_ts" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d payments, want 1 (cut: %s)", n, seen.CutError)
	}
	t.Logf("the client saw the cut as: %s", seen.CutError)
}
