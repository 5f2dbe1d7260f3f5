package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/worker"
)

// TestConversationCommitsATurnOnce: the retry of a turn whose stream broke
// after a dispatch commits one tool_result per tool_use, from its own ids;
// the cut call is recorded as not run and never sent; a second commit is
// refused.
func TestConversationCommitsATurnOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.StartWorker(ctx, worker.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		t.Fatal(err)
	}
	rs, err := jobs.NewClient(st.JS).Results(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()

	pay := func(id, invoice string) jobs.ToolCall {
		return jobs.ToolCall{ToolUseID: id, Tool: "send_payment", Args: json.RawMessage(`{"invoice_id":"` + invoice + `","amount_cents":500,"currency":"EUR"}`)}
	}
	conv := rs.NewConversation("conv-turn")
	turn := conv.NextTurn()
	first := turn.Attempt()
	if _, err := first.Dispatch(ctx, pay("toolu_a0", "inv_1")); err != nil {
		t.Fatal(err)
	}
	first.Cut(pay("toolu_a0_cut", "inv_cut")) // the stream broke inside this block
	retry := turn.Attempt()                   // abandons the first attempt
	if _, err := first.Dispatch(ctx, pay("toolu_late", "inv_1")); !errors.Is(err, jobs.ErrAttemptAbandoned) {
		t.Fatalf("dispatch on an abandoned attempt: %v", err)
	}
	if _, err := retry.Dispatch(ctx, pay("toolu_a1", "inv_1")); err != nil {
		t.Fatal(err)
	}
	ct, err := turn.Commit(ctx, retry)
	if err != nil {
		t.Fatal(err)
	}
	if len(ct.ToolUses) != 1 || len(ct.ToolResults) != 1 || ct.ToolResults[0].ToolUseID != "toolu_a1" || ct.ToolResults[0].IsError {
		t.Fatalf("committed %+v", ct)
	}
	if _, err := turn.Commit(ctx, retry); !errors.Is(err, jobs.ErrTurnCommitted) {
		t.Fatalf("second commit: %v", err)
	}
	if _, err := turn.Commit(ctx, first); !errors.Is(err, jobs.ErrTurnCommitted) {
		t.Fatalf("commit of the abandoned attempt: %v", err)
	}

	// A turn whose only block was cut commits as not run.
	next := conv.NextTurn()
	if next.Index != 1 {
		t.Fatalf("next turn index %d", next.Index)
	}
	a := next.Attempt()
	a.Cut(pay("toolu_b0", "inv_2"))
	ct, err = next.Commit(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if tr := ct.ToolResults[0]; !tr.IsError || string(tr.Content) != `"`+jobs.NotRun+`"` || tr.Result != nil {
		t.Fatalf("cut call committed as %+v", tr)
	}
	if err := conv.Check(); err != nil {
		t.Fatal(err)
	}
	if n := conv.NotRunCalls(); n != 2 {
		t.Fatalf("not run: %d, want 2", n)
	}
	var invoices []string
	for _, p := range st.Sandbox.Payments() {
		invoices = append(invoices, p.InvoiceID)
	}
	if len(invoices) != 1 || invoices[0] != "inv_1" {
		t.Fatalf("payments %v, want one for inv_1", invoices)
	}
}

// TestResultsDropsWhatNobodyExpects: a cancelled expectation gets nothing,
// an expected id gets its result, and after Close a wait fails.
func TestResultsDropsWhatNobodyExpects(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.StartWorker(ctx, worker.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		t.Fatal(err)
	}
	client := jobs.NewClient(st.JS)
	rs, err := client.Results(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	job := func(id string) *jobs.Job {
		return &jobs.Job{ConversationID: "conv-r", TurnIndex: 1, Tool: "send_payment", ToolUseID: id,
			Args: json.RawMessage(`{"invoice_id":"inv_r","amount_cents":100,"currency":"EUR"}`)}
	}
	dropped := rs.Expect("toolu_dropped")
	dropped.Cancel()
	kept := rs.Expect("toolu_kept")
	for _, id := range []string{"toolu_dropped", "toolu_kept"} {
		if _, err := client.Publish(ctx, job(id)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := kept.Wait(ctx)
	if err != nil || got[0].ToolUseID != "toolu_kept" {
		t.Fatalf("kept: %v %v", got, err)
	}
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	if got, err := dropped.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a cancelled expectation got %v, %v", got, err)
	}
	rs.Close()
	if _, err := rs.Expect("toolu_late").Wait(ctx); !errors.Is(err, jobs.ErrResultsClosed) {
		t.Fatalf("wait after Close: %v", err)
	}
}
