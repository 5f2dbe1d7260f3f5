package jobs_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/worker"
)

// startStack starts an embedded broker, ledger and sandbox with a worker
// answering, stopped when the test ends.
func startStack(ctx context.Context, t *testing.T) *embedded.Stack {
	t.Helper()
	st, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, err := st.StartWorker(ctx, worker.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		t.Fatal(err)
	}
	return st
}

// payment is a send_payment call of the demo registry.
func payment(toolUseID, invoice string) jobs.ToolCall {
	return jobs.ToolCall{ToolUseID: toolUseID, Tool: "send_payment",
		Args: json.RawMessage(`{"invoice_id":"` + invoice + `","amount_cents":500,"currency":"EUR"}`)}
}
