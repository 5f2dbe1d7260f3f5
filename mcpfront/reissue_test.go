package mcpfront_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/mcpfront"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
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

// TestAResultOfAnotherCallWhileTheFirstRequestWaitsIsNotReturned: as
// above, but the other call's job is published while the front door's
// first request still waits, so its result comes through the reader of
// every conversation's results, not from the start of the conversation.
// It comes first (a read, while the payment takes 1.5 s) and must not
// answer the payment.
func TestAResultOfAnotherCallWhileTheFirstRequestWaitsIsNotReturned(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{LatencyMS: 1500})
	args := payment("inv_live")
	raw, _ := json.Marshal(args)
	k, err := jobs.Call{ConversationID: "conv-live", TurnIndex: 1, Tool: "send_payment", Args: raw}.Key()
	if err != nil {
		t.Fatal(err)
	}
	before := streamMsgs(t, b.st, jobs.JobsStream)
	got := make(chan string, 1)
	go func() {
		res, err := call(context.Background(), connect(t, b.addr), "send_payment", args, named("conv-live", 1))
		if err != nil {
			got <- err.Error()
			return
		}
		got <- asJSON(t, res)
	}()
	testenv.Eventually(t, 10*time.Second, "the front door's job", func() bool { return streamMsgs(t, b.st, jobs.JobsStream) > before })
	other := &jobs.Job{ConversationID: "conv-live", TurnIndex: 9, Tool: "search_orders", ToolUseID: "mcp_" + k,
		Args: json.RawMessage(`{"query":"foreign"}`)}
	if _, err := jobs.NewClient(b.st.JS).Publish(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	res := <-got
	var r struct {
		Meta map[string]any `json:"_meta"`
	}
	json.Unmarshal([]byte(res), &r)
	if r.Meta["io.toolq/key"] != k {
		t.Fatalf("the payment %s was answered with: %s", k, res)
	}
}

// TestAReissueOfACallSettledUnderItsLegacyKeyIsAnswered: a call made
// through the front door before the member-order fix (args whose names
// share a high surrogate: 👍 and 👎) has its ledger row under its legacy
// key. After the upgrade the client re-issues it (same _meta, same args):
// the worker answers from the legacy row (worker/legacykey.go), with a
// result whose key is the legacy key, and the front door takes it as the
// call's answer; it took only the new key, and told the client -32001
// "send it again", every time.
func TestAReissueOfACallSettledUnderItsLegacyKeyIsAnswered(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		runs.Add(1)
		return json.RawMessage(`{"receipt":"after"}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "vote", Class: tools.KeyedWrite, Executor: exec,
		Schema: json.RawMessage(`{"type":"object"}`)}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, quiet := workerStack(t, embedded.Config{Tools: reg}, worker.Config{})
	const votes = `{"poll":"p-7","votes":{"👎":3,"👍":12}}`
	call := jobs.Call{ConversationID: "conv-legacy", TurnIndex: 1, Tool: "vote", Args: []byte(votes)}
	m, err := call.Material()
	if err != nil {
		t.Fatal(err)
	}
	legacy, ok := m.Legacy()
	if !ok || legacy.Key() == m.Key() {
		t.Fatal("no legacy key")
	}
	// The row a consumer before the fix wrote for the front door's call.
	res, err := st.Store.Claim(context.Background(), []ledger.Claim{{Key: legacy.Key(), ConversationID: call.ConversationID, TurnIndex: 1,
		Tool: "vote", ArgsDigest: legacy.ArgsDigest(), ToolUseID: "mcp_" + legacy.Key(), Owner: "before-the-fix", Lease: time.Minute, Token: "tok-before"}})
	if err != nil || !res[0].Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if err := st.Store.Complete(context.Background(), res[0].Row.Fence(), json.RawMessage(`{"receipt":"before"}`)); err != nil {
		t.Fatal(err)
	}
	_, addr := serve(t, st, quiet, func(c *mcpfront.Config) { c.Wait = 5 * time.Second })
	args := json.RawMessage(votes) // as the client writes it (a TypeScript or Python client keeps the order)
	cs := connect(t, addr)
	got, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "vote", Arguments: args, Meta: named("conv-legacy", 1)})
	if err != nil { // as the message says, send it again
		got, err = connect(t, addr).CallTool(context.Background(), &mcp.CallToolParams{Name: "vote", Arguments: args, Meta: named("conv-legacy", 1)})
	}
	if err != nil {
		t.Fatalf("the re-issue of a call settled under its legacy key was not answered (runs: %d): %v", runs.Load(), err)
	}
	if runs.Load() != 0 || !strings.Contains(text(t, got), "before") {
		t.Fatalf("runs %d, answer %s", runs.Load(), asJSON(t, got))
	}
}
