package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// TestApproveAndDenyCommands: an operator decides calls awaiting approval
// from the CLI; the decision is recorded with who, why and the digest,
// announced on the approvals stream, shown by ledger show, and a second
// decision is refused naming the first.
func TestApproveAndDenyCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, js := withStreams(t)
	env := map[string]string{"TOOLQ_DATA_DIR": t.TempDir(), "NATS_URL": n.URL}
	st := migratedLedger(t, env)
	// Real calls' keys: a decision is announced as the call's tenant's,
	// the default tenant's here, only when the row's key is that call's.
	await := func(name, args string) string {
		key, err := jobs.Call{ConversationID: "c", Tool: "send_payment", Args: json.RawMessage(args)}.Key()
		if err != nil {
			t.Fatal(err)
		}
		res, err := st.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: "c", Tool: "send_payment", ArgsDigest: "d-" + name,
			ToolUseID: "toolu_" + name, Owner: "o", Lease: time.Hour, Token: "t-" + name}})
		if err != nil || !res[0].Claimed {
			t.Fatalf("claim %s: %v", name, err)
		}
		if _, err := st.AwaitApproval(ctx, res[0].Row.Fence(), ledger.ApprovalInfo{Args: json.RawMessage(args), Group: "finance", TTL: time.Hour}, "toolu_"+name); err != nil {
			t.Fatal(err)
		}
		return key
	}
	yes := await("k-yes", `{"amount_cents":90000}`)
	no := await("k-no", `{"amount_cents":90001}`)
	for _, bad := range [][]string{
		{"approve", yes},
		{"approve", yes, "--reason", " "},
		{"approve", yes, "--reason", "r", "--by", ""},
		{"approve", "--reason", "r"},
		// Longer than the call's event and results have room for.
		{"approve", yes, "--reason", strings.Repeat("r", ledger.MaxDecisionReason+1), "--by", "alice"},
		{"approve", yes, "--reason", "r", "--by", strings.Repeat("a", ledger.MaxDecisionBy+1)},
	} {
		if _, err := runConsumer(t, env, bad...); err == nil {
			t.Errorf("%v was taken", bad)
		}
	}
	if _, err := runConsumer(t, env, "approve", yes, "--reason", "invoice 42", "--by", "alice", "--digest", "other"); err == nil ||
		!strings.Contains(err.Error(), "not the call that was decided on") {
		t.Fatalf("approve with another digest: %v", err)
	}
	out, err := runConsumer(t, env, "approve", yes, "--reason", "invoice 42", "--by", "alice", "--digest", "d-k-yes")
	if err != nil || !strings.Contains(out, yes+" approved by alice") {
		t.Fatalf("approve: %q %v", out, err)
	}
	if out, err := runConsumer(t, env, "deny", no, "--reason", "unknown payee", "--by", "bob"); err != nil || !strings.Contains(out, "denied") {
		t.Fatalf("deny: %q %v", out, err)
	}
	if _, err := runConsumer(t, env, "deny", yes, "--reason", "second thoughts", "--by", "carol"); err == nil ||
		!strings.Contains(err.Error(), "approved by alice") {
		t.Fatalf("a second decision: %v", err)
	}
	out, err = runConsumer(t, env, "ledger", "show", no)
	if err != nil || !strings.Contains(out, "approval:") || !strings.Contains(out, "bob: deny denied (unknown payee)") ||
		!strings.Contains(out, "args digest d-k-no") || !strings.Contains(out, `{"amount_cents":90001}`) {
		t.Fatalf("ledger show of the denied call:\n%s %v", out, err)
	}
	// Announced: the events are on the approvals stream, and the jobs of
	// both calls published again for a worker to answer.
	s, err := js.Stream(ctx, jobs.ApprovalsStream)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := s.Info(ctx); info.State.Msgs != 2 {
		t.Fatalf("%d approval events, want approved and denied", info.State.Msgs)
	}
	jobsStream, _ := js.Stream(ctx, jobs.JobsStream)
	if info, _ := jobsStream.Info(ctx); info.State.Msgs != 2 {
		t.Fatalf("%d jobs published again, want 2", info.State.Msgs)
	}
}
