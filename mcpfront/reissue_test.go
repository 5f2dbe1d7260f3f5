package mcpfront_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/mcpfront"
)

// TestAReissueAfterAnOperatorResolvedGetsTheResolutionNotTheStaleIndeterminate:
// an indeterminate call that an operator resolved as done is answered,
// when re-issued inside the jobs stream's duplicate window (its
// re-publication dropped), with the operator's output from the ledger,
// not with the indeterminate result the results stream still holds.
func TestAReissueAfterAnOperatorResolvedGetsTheResolutionNotTheStaleIndeterminate(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{DropAfterEffectRate: 1})
	cs := connect(t, b.addr)
	first := mustCall(t, cs, "create_ticket", ticket("resolved"), named("conv-resolved", 1))
	if status(first) != "indeterminate" {
		t.Fatalf("want indeterminate, got %s", asJSON(t, first))
	}
	// The operator checked the sandbox: the ticket exists.
	if _, err := b.st.Store.Resolve(context.Background(), key(first), ledger.Resolution{
		Output: json.RawMessage(`{"id":"tk_found_by_operator"}`), By: "ops", Reason: "the ticket is in the tracker"}); err != nil {
		t.Fatal(err)
	}
	row, err := b.st.Store.Get(context.Background(), key(first))
	if err != nil || row.State != ledger.Completed {
		t.Fatalf("row after resolve: %+v, %v", row, err)
	}
	again := mustCall(t, connect(t, b.addr), "create_ticket", ticket("resolved"), named("conv-resolved", 1))
	if status(again) != "ok" || !strings.Contains(text(t, again), "tk_found_by_operator") || key(again) != key(first) {
		t.Fatalf("the ledger says completed with the operator's output; the re-issue was answered %s", asJSON(t, again))
	}
	if n := b.tickets("resolved"); n != 1 {
		t.Fatalf("%d tickets, want 1", n)
	}
}

// TestAReissueAfterAnOperatorResolvedAsNotRunSaysWhenToSendItAgain: an
// indeterminate call resolved as not run has no result to give; its
// re-issue inside the duplicate window (dropped: it cannot run yet) is
// told so and when to send it again, and nothing runs twice.
func TestAReissueAfterAnOperatorResolvedAsNotRunSaysWhenToSendItAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{DropAfterEffectRate: 1})
	first := mustCall(t, connect(t, b.addr), "create_ticket", ticket("not-run"), named("conv-not-run", 1))
	if status(first) != "indeterminate" {
		t.Fatalf("want indeterminate, got %s", asJSON(t, first))
	}
	if _, err := b.st.Store.Resolve(context.Background(), key(first), ledger.Resolution{NotRun: true, By: "ops", Reason: "no ticket"}); err != nil {
		t.Fatal(err)
	}
	_, err := call(context.Background(), connect(t, b.addr), "create_ticket", ticket("not-run"), named("conv-not-run", 1))
	var rpc *jsonrpc.Error
	if !errors.As(err, &rpc) || rpc.Code != mcpfront.CodeNoResultYet || !strings.Contains(rpc.Message, "resolved it as not run") ||
		!strings.Contains(rpc.Message, "duplicate window") {
		t.Fatalf("want CodeNoResultYet saying the call was resolved as not run and when to send it again, got %v", err)
	}
	if n := b.tickets("not-run"); n != 1 {
		t.Fatalf("%d tickets, want 1", n)
	}
}

// TestAResultOfAnotherCallWithTheSameToolUseIDIsNotReturned: the front
// door answers a call only with a result that carries the call's key. A
// job published by another agent in the same conversation with the same
// tool_use_id (a replayed or forged transcript, a client bug) is another
// call, and its result does not answer the front door's re-issue.
func TestAResultOfAnotherCallWithTheSameToolUseIDIsNotReturned(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	cs := connect(t, b.addr)
	mine := mustCall(t, cs, "send_payment", payment("inv_mine"), named("conv-foreign", 1))
	if mine.IsError {
		t.Fatal(asJSON(t, mine))
	}
	// Another agent, not through the front door, same conversation, same tool_use_id.
	other := &jobs.Job{ConversationID: "conv-foreign", TurnIndex: 9, Tool: "send_payment", ToolUseID: "mcp_" + key(mine),
		Args: json.RawMessage(`{"invoice_id":"inv_theirs","amount_cents":777,"currency":"USD"}`)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := jobs.NewClient(b.st.JS).PublishAndAwait(ctx, other); err != nil {
		t.Fatal(err)
	}
	again := mustCall(t, connect(t, b.addr), "send_payment", payment("inv_mine"), named("conv-foreign", 1))
	if key(again) != key(mine) || asJSON(t, again) != asJSON(t, mine) {
		t.Fatalf("the re-issue of %s was answered with another call's result:\n%s\nnot\n%s", key(mine), asJSON(t, again), asJSON(t, mine))
	}
}
