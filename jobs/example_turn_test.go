package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/worker"
)

// A turn whose stream broke after its payment call was dispatched is
// retried; the model emits the call again with a new tool_use_id, and the
// turn is committed once, with the result addressed to the retry's id.
func ExampleConversation() {
	ctx := context.Background()
	st, _ := embedded.Start(ctx, embedded.Config{})
	defer st.Close()
	st.StartWorker(ctx, worker.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	results, _ := jobs.NewClient(st.JS).Results(ctx, "")
	defer results.Close()

	pay := func(id string) jobs.ToolCall {
		return jobs.ToolCall{ToolUseID: id, Tool: "send_payment", Args: json.RawMessage(`{"invoice_id":"inv_7","amount_cents":900,"currency":"EUR"}`)}
	}
	conv := results.NewConversation("conv-7")
	turn := conv.NextTurn()
	first := turn.Attempt()
	first.Dispatch(ctx, pay("toolu_1")) // its block completed; then the stream broke
	retry := turn.Attempt()             // abandons the first attempt
	retry.Dispatch(ctx, pay("toolu_2"))
	ct, _ := turn.Commit(ctx, retry)
	for i, use := range ct.ToolUses {
		fmt.Println(use.ToolUseID, ct.ToolResults[i].Result.Status)
	}
	_, err := turn.Commit(ctx, retry)
	fmt.Println(err)
	fmt.Println("record:", conv.Check(), "payments:", len(st.Sandbox.Payments()))
	// Output:
	// toolu_2 ok
	// jobs: turn already committed
	// record: <nil> payments: 1
}
