package mcpfront_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/mcpfront"
	"github.com/toolq/toolq/worker"
)

// The front door of the demo registry, called by an MCP client: the call
// names its conversation and turn in _meta, and the same call sent again
// (after a broken stream, say) gets the first result, not a second payment.
func ExampleServer() {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := embedded.Start(ctx, embedded.Config{Logger: quiet}) // NATS, a ledger, the demo tools and their sandbox
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	if _, err := st.StartWorker(ctx, worker.Config{Logger: quiet}); err != nil {
		fmt.Println(err)
		return
	}
	front, err := mcpfront.New(mcpfront.Config{Registry: st.Tools, JS: st.JS, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer front.Close()
	srv := httptest.NewServer(front.Handler()) // mounted at /mcp by the consumer
	defer srv.Close()

	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	for range 2 {
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL, DisableStandaloneSSE: true}, nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{
			Name:      "send_payment",
			Arguments: map[string]any{"invoice_id": "inv_9", "amount_cents": 1500, "currency": "EUR"},
			Meta:      mcp.Meta{mcpfront.MetaConversationID: "conv-42", mcpfront.MetaTurnIndex: 7},
		})
		cs.Close()
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(res.Meta[mcpfront.MetaStatus], res.Meta[mcpfront.MetaKey], res.Content[0].(*mcp.TextContent).Text)
	}
	fmt.Println(len(st.Sandbox.Payments()), "payment")
	// Output:
	// ok f59a97883fdd6f13531d0209b36a3446 {"amount_cents":1500,"currency":"EUR","id":"pay_000001","invoice_id":"inv_9","object":"payment","status":"succeeded"}
	// ok f59a97883fdd6f13531d0209b36a3446 {"amount_cents":1500,"currency":"EUR","id":"pay_000001","invoice_id":"inv_9","object":"payment","status":"succeeded"}
	// 1 payment
}
