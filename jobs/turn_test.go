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

// TestRunTurnCalledAgainForTheSameTurnGetsItsResults: the agent runs a turn
// again with the same tool_use_ids (its first RunTurn failed after
// publishing, or it restarted). JetStream drops the jobs as exact
// re-publications and toolq does not answer them again, so the results are
// those published before the second call began: RunTurn reads them, and
// nothing runs twice.
func TestRunTurnCalledAgainForTheSameTurnGetsItsResults(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := startStack(ctx, t)
	client := jobs.NewClient(st.JS)
	calls := []jobs.ToolCall{payment("toolu_p0", "inv_1"), payment("toolu_p1", "inv_2")}
	first, err := client.RunTurn(ctx, "conv-again", 0, calls)
	if err != nil || len(first) != 2 {
		t.Fatalf("first run: %v, %v", first, err)
	}
	again, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	second, err := client.RunTurn(again, "conv-again", 0, calls)
	if err != nil {
		t.Fatalf("the same turn run again: %v (got %d of 2 results)", err, len(second))
	}
	for i := range calls {
		if second[i].ToolUseID != calls[i].ToolUseID || string(second[i].Content) != string(first[i].Content) {
			t.Fatalf("result %d: %+v, first run %+v", i, second[i], first[i])
		}
	}
	if n := len(st.Sandbox.Payments()); n != 2 {
		t.Fatalf("%d payments, want 2", n)
	}
}

// TestCommitOfADispatchDroppedAsARepublication: an agent that restarts
// replays its record and dispatches a call it had dispatched before, with
// the same tool_use_id, through a new results reader. JetStream drops the
// job as an exact re-publication; its result came before the reader
// started, and Commit still finds it.
func TestCommitOfADispatchDroppedAsARepublication(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := startStack(ctx, t)
	client := jobs.NewClient(st.JS)
	play := func(ctx context.Context) (*jobs.CommittedTurn, jobs.Published, error) {
		rs, err := client.Results(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		turn := rs.NewConversation("conv-restart").NextTurn()
		a := turn.Attempt()
		pub, err := a.Dispatch(ctx, payment("toolu_r0", "inv_r"))
		if err != nil {
			t.Fatal(err)
		}
		ct, err := turn.Commit(ctx, a)
		return ct, pub, err
	}
	first, pub, err := play(ctx)
	if err != nil || pub.Duplicate {
		t.Fatalf("first play: %v, %+v", err, pub)
	}
	again, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	second, pub, err := play(again)
	if !pub.Duplicate {
		t.Fatalf("the second dispatch was not dropped as a re-publication: %+v", pub)
	}
	if err != nil {
		t.Fatalf("commit after the restart: %v", err)
	}
	if string(second.ToolResults[0].Content) != string(first.ToolResults[0].Content) {
		t.Fatalf("after the restart %s, before %s", second.ToolResults[0].Content, first.ToolResults[0].Content)
	}
	if n := len(st.Sandbox.Payments()); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

// TestWaitAgainAfterItsContextEndedKeepsWhatItRead: a Wait that ends with
// its context after one of two results came keeps that result, so the
// Wait of a Commit tried again returns both instead of waiting for ever.
func TestWaitAgainAfterItsContextEndedKeepsWhatItRead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := startStack(ctx, t)
	client := jobs.NewClient(st.JS)
	rs, err := client.Results(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	job := func(c jobs.ToolCall) *jobs.Job {
		return &jobs.Job{ConversationID: "conv-wait", Tool: c.Tool, ToolUseID: c.ToolUseID, Args: c.Args}
	}
	aw := rs.Expect("toolu_w0", "toolu_w1")
	if _, err := client.Publish(ctx, job(payment("toolu_w0", "inv_w0"))); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Await(ctx, "conv-wait", "toolu_w0"); err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithTimeout(ctx, 2*time.Second)
	got, err := aw.Wait(short)
	stop()
	if !errors.Is(err, context.DeadlineExceeded) || got[0] == nil {
		t.Fatalf("the first wait should end with its context after toolu_w0's result: %v, %v", got, err)
	}
	if _, err := client.Publish(ctx, job(payment("toolu_w1", "inv_w1"))); err != nil {
		t.Fatal(err)
	}
	again, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	got, err = aw.Wait(again)
	if err != nil || got[0] == nil || got[0].ToolUseID != "toolu_w0" || got[1] == nil || got[1].ToolUseID != "toolu_w1" {
		t.Fatalf("the wait tried again: %v, %v", got, err)
	}
}

// TestDispatchWhileTheTurnCommitsIsRefused: once Commit has taken the
// attempt's calls, a call dispatched on it would run without ever being in
// the committed turn: Dispatch refuses it.
func TestDispatchWhileTheTurnCommitsIsRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := embedded.Start(ctx, embedded.Config{}) // no worker: Commit waits
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := jobs.ProvisionStreams(ctx, st.JS, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	rs, err := jobs.NewClient(st.JS).Results(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	turn := rs.NewConversation("conv-late").NextTurn()
	a := turn.Attempt()
	if _, err := a.Dispatch(ctx, payment("toolu_l0", "inv_l0")); err != nil {
		t.Fatal(err)
	}
	committing, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := turn.Commit(committing, a); done <- err }()
	ended, end := context.WithCancel(ctx)
	end()
	for { // until Commit has taken the attempt (a Commit that ends at once, else)
		if _, err := turn.Commit(ended, a); errors.Is(err, jobs.ErrTurnCommitted) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := a.Dispatch(ctx, payment("toolu_l1", "inv_l1")); !errors.Is(err, jobs.ErrTurnCommitted) {
		t.Fatalf("dispatch while the turn commits: %v", err)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("commit: %v", err)
	}
	if n := len(st.Sandbox.Payments()); n != 0 {
		t.Fatalf("%d payments without a worker", n)
	}
	stream, err := st.JS.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := stream.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("%d jobs published, want the one in the turn", n)
	}
}

// TestAnExpectationInAConversationTakesOnlyItsResult: a tool_use_id may
// recur in another conversation (a replayed model response); a wait kept to
// one conversation is not answered by the other's result.
func TestAnExpectationInAConversationTakesOnlyItsResult(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := jobs.NewClient(startStack(ctx, t).JS)
	rs, err := client.Results(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	mine := rs.ExpectIn("conv-b", "toolu_same")
	for _, conv := range []string{"conv-a", "conv-b"} {
		j := &jobs.Job{ConversationID: conv, TurnIndex: 1, Tool: "send_payment", ToolUseID: "toolu_same",
			Args: json.RawMessage(`{"invoice_id":"inv_` + conv + `","amount_cents":100,"currency":"EUR"}`)}
		if _, err := client.PublishAndAwait(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	got, err := mine.Wait(ctx)
	if err != nil || got[0].ConversationID != "conv-b" {
		t.Fatalf("got %+v %v, want conv-b's result", got[0], err)
	}
}
