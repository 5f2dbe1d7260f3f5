package embedded_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/worker"
)

// The whole stack in one process: the same payment sent twice, with two
// tool_use_ids, is paid once and answered twice.
func ExampleStart() {
	ctx := context.Background()
	st, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	if _, err := st.StartWorker(ctx, worker.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		fmt.Println(err)
		return
	}
	client := jobs.NewClient(st.JS)
	args := json.RawMessage(`{"invoice_id":"inv_1","amount_cents":500,"currency":"EUR"}`)
	for _, id := range []string{"toolu_a", "toolu_b"} {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		r, err := client.PublishAndAwait(wctx, &jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "send_payment", ToolUseID: id, Args: args})
		cancel()
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(id, r.Status, "duplicate:", r.Duplicate)
	}
	fmt.Println("payments:", len(st.Sandbox.Payments()))
	// Output:
	// toolu_a ok duplicate: false
	// toolu_b ok duplicate: true
	// payments: 1
}
