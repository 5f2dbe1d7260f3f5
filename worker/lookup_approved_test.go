package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestLookupOfAnApprovedCallThatHasNotRunYetSaysApproved: docs/agents.md, "Asking
// again": a later turn looks the call up by its key, and Lookup answers
// awaiting_approval until a person decides, then completed or failed. An
// approved call waits (released) until its job is delivered again: at
// once when the decision is announced, after the sweep when it was
// recorded without NATS (consumer approve with NATS down), later still
// behind a backlog or between retries of its run. Meanwhile Lookup must not
// answer "unknown" ("no row: never ran, or purged") with no approval: the
// person's approval would read as a call toolq never heard of.
func TestLookupOfAnApprovedCallThatHasNotRunYetSaysApproved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"paid":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Approval: &tools.Approval{Group: "finance"}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// No sweep: the decision stays unannounced, as with NATS down.
	js, store := startWorker(t, reg, worker.Config{ApprovalSweep: -1})
	svc, err := worker.ServeLookup(js.Conn(), store, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	j := &jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_ask", Args: json.RawMessage(`{"amount_cents":90000}`)}
	pending, err := client.PublishAndAwait(actx, j)
	if err != nil || pending.Status != jobs.StatusAwaitingApproval {
		t.Fatalf("%+v %v", pending, err)
	}
	// Recorded in the ledger, not announced (the CLI without NATS).
	if _, err := store.Decide(ctx, pending.Key, ledger.Decision{Approve: true, By: "alice", Reason: "invoice 42", Group: "finance"}); err != nil {
		t.Fatal(err)
	}
	l, err := client.Lookup(actx, pending.Key)
	if err != nil {
		t.Fatal(err)
	}
	if l.State != jobs.LookupApproved || l.Approval == nil || l.Approval.Decision != "approved" || l.Approval.DecidedBy != "alice" {
		t.Fatalf("lookup of an approved call not run yet: state %q, approval %+v", l.State, l.Approval)
	}
}
