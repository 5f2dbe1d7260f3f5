package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/mcpfront"
)

// TestMCPListen: `consumer --mcp-listen` serves the registry to MCP
// clients. A payment re-issued on a new session is paid once; a call in
// flight at SIGTERM gets its result while the worker drains.
func TestMCPListen(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, logs testenv.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--sandbox-listen", "127.0.0.1:0",
			"--mcp-listen", "127.0.0.1:0", "--log-level", "warn"}, cli.IO{Out: &out, Err: &logs}, func(string) string { return "" })
	}()
	var natsURL, sandboxURL, mcpURL string
	testenv.Eventually(t, 60*time.Second, "the banner", func() bool {
		banner := out.String()
		natsURL = find(banner, `embedded, (nats://\S+)`)
		sandboxURL = find(banner, `sandbox\s+(http://\S+)`)
		mcpURL = find(banner, `mcp\s+(http://\S+/mcp)`)
		return natsURL != "" && sandboxURL != "" && mcpURL != ""
	})
	session := func() *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
			Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: mcpURL, DisableStandaloneSSE: true}, nil)
		if err != nil {
			t.Fatalf("%v\n%s", err, logs.String())
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	pay := func(cs *mcp.ClientSession, turn int) (*mcp.CallToolResult, error) {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second) // the client outlives the consumer's ctx
		defer ccancel()
		return cs.CallTool(cctx, &mcp.CallToolParams{Name: "send_payment",
			Arguments: map[string]any{"invoice_id": "inv_mcp", "amount_cents": 700, "currency": "EUR"},
			Meta:      mcp.Meta{mcpfront.MetaConversationID: "conv-mcp", mcpfront.MetaTurnIndex: turn}})
	}
	payments := func() int {
		resp, err := http.Get(sandboxURL + "/v1/payments")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct{ Data []sandbox.Payment }
		json.NewDecoder(resp.Body).Decode(&body)
		return len(body.Data)
	}

	first, err := pay(session(), 1)
	if err != nil || first.IsError {
		t.Fatalf("%+v %v\n%s", first, err, logs.String())
	}
	again, err := pay(session(), 1)
	if err != nil || again.Content[0].(*mcp.TextContent).Text != first.Content[0].(*mcp.TextContent).Text {
		t.Fatalf("re-issue: %+v %v", again, err)
	}
	if n := payments(); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}

	// SIGTERM while a call runs: the worker drains, and the call's client
	// gets its result.
	resp, err := http.Post(sandboxURL+"/v1/_faults", "application/json", strings.NewReader(`{"latency_ms":1500}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	answered := make(chan *mcp.CallToolResult, 1)
	cs := session()
	go func() {
		res, err := pay(cs, 2)
		if err != nil {
			t.Errorf("call in flight at SIGTERM: %v", err)
		}
		answered <- res
	}()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	key, _ := jobs.Call{ConversationID: "conv-mcp", TurnIndex: 2, Tool: "send_payment", Args: []byte(`{"invoice_id":"inv_mcp","amount_cents":700,"currency":"EUR"}`)}.Key()
	testenv.Eventually(t, 30*time.Second, "the second payment in flight", func() bool {
		l, err := jobs.NewClient(js).Lookup(ctx, key)
		return err == nil && l.State == jobs.LookupInFlight
	})
	cancel()
	if res := <-answered; res == nil || res.IsError || res.Meta[mcpfront.MetaKey] != key {
		t.Fatalf("call in flight at SIGTERM: %+v", res)
	}
	if err := <-done; err != nil {
		t.Fatalf("consumer: %v", err)
	}
}
