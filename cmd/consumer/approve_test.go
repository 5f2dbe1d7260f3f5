package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
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
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TOOLQ_DATA_DIR": t.TempDir(), "NATS_URL": n.URL}
	if _, err := runConsumer(t, env, "migrate"); err != nil {
		t.Fatal(err)
	}
	st, err := ledger.Open(ctx, "", env["TOOLQ_DATA_DIR"])
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	await := func(key string) ledger.Row {
		res, err := st.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: "c", Tool: "send_payment", ArgsDigest: "d-" + key,
			ToolUseID: "toolu_" + key, Owner: "o", Lease: time.Hour, Token: "t-" + key}})
		if err != nil || !res[0].Claimed {
			t.Fatalf("claim %s: %v", key, err)
		}
		row, err := st.AwaitApproval(ctx, res[0].Row.Fence(), ledger.ApprovalInfo{Args: json.RawMessage(`{"amount_cents":90000}`), Group: "finance", TTL: time.Hour}, "toolu_"+key)
		if err != nil {
			t.Fatal(err)
		}
		return row
	}
	await("k-yes")
	await("k-no")
	for _, bad := range [][]string{
		{"approve", "k-yes"},
		{"approve", "k-yes", "--reason", " "},
		{"approve", "k-yes", "--reason", "r", "--by", ""},
		{"approve", "--reason", "r"},
	} {
		if _, err := runConsumer(t, env, bad...); err == nil {
			t.Errorf("%v was taken", bad)
		}
	}
	if _, err := runConsumer(t, env, "approve", "k-yes", "--reason", "invoice 42", "--by", "alice", "--digest", "other"); err == nil ||
		!strings.Contains(err.Error(), "not the call that was decided on") {
		t.Fatalf("approve with another digest: %v", err)
	}
	out, err := runConsumer(t, env, "approve", "k-yes", "--reason", "invoice 42", "--by", "alice", "--digest", "d-k-yes")
	if err != nil || !strings.Contains(out, "k-yes approved by alice") {
		t.Fatalf("approve: %q %v", out, err)
	}
	if out, err := runConsumer(t, env, "deny", "k-no", "--reason", "unknown payee", "--by", "bob"); err != nil || !strings.Contains(out, "denied") {
		t.Fatalf("deny: %q %v", out, err)
	}
	if _, err := runConsumer(t, env, "deny", "k-yes", "--reason", "second thoughts", "--by", "carol"); err == nil ||
		!strings.Contains(err.Error(), "approved by alice") {
		t.Fatalf("a second decision: %v", err)
	}
	out, err = runConsumer(t, env, "ledger", "show", "k-no")
	if err != nil || !strings.Contains(out, "approval:") || !strings.Contains(out, "bob: deny denied (unknown payee)") ||
		!strings.Contains(out, "args digest d-k-no") || !strings.Contains(out, `{"amount_cents":90000}`) {
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
