package approvals_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// TestADecidedCallsJobGoesOutEvenWhenAnotherTenantTookItsID: tenants
// share TOOLQ_JOBS's duplicate window. Should acme learn the message id of
// globex's decided call's job (its key, attempt and the decision's time)
// and publish it first on its own subject, the job is published all the
// same, on globex's subject: toolq's publication dropped as a duplicate of
// a message that is not its job is published again under another id.
func TestADecidedCallsJobGoesOutEvenWhenAnotherTenantTookItsID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	tenants := []string{"acme", "globex"}
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{Tenants: tenants}); err != nil {
		t.Fatal(err)
	}
	store, err := ledger.OpenSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	args := json.RawMessage(`{"amount_cents":90000}`)
	key, err := jobs.Call{Tenant: "globex", ConversationID: "c", TurnIndex: 1, Tool: "pay", Args: args}.Key()
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: "c", TurnIndex: 1, Tool: "pay", ArgsDigest: "d",
		ToolUseID: "toolu_1", Owner: "t", Lease: time.Minute, Token: "tok"}})
	if err != nil || !got[0].Claimed {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := store.AwaitApproval(ctx, got[0].Row.Fence(), ledger.ApprovalInfo{Args: args, Group: "finance", TTL: time.Hour}, "toolu_1"); err != nil {
		t.Fatal(err)
	}
	// Decided without NATS: announced by the sweep below.
	offline, err := approvals.New(approvals.Config{Ledger: store, Tenants: tenants})
	if err != nil {
		t.Fatal(err)
	}
	row, err := offline.Decide(ctx, key, ledger.Decision{Approve: true, By: "gina", Reason: "invoice 7"})
	if err != nil {
		t.Fatal(err)
	}
	id := "decided:" + key + ":approved:" + strconv.FormatInt(row.Attempt, 10) + ":" + strconv.FormatInt(row.LastDecision().At.UnixNano(), 10)
	forged := nats.NewMsg(jobs.TenantJobSubject("acme", "pay"))
	forged.Data = []byte(`{}`)
	forged.Header.Set(jetstream.MsgIDHeader, id)
	if _, err := js.PublishMsg(ctx, forged); err != nil {
		t.Fatal(err)
	}

	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Tenants: tenants, Unanswered: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if _, again, err := svc.Sweep(ctx); err != nil || again != 1 {
		t.Fatalf("sweep: %d again, %v", again, err)
	}
	s, _ := js.Stream(ctx, jobs.JobsStream)
	m, err := s.GetLastMsgForSubject(ctx, jobs.TenantJobSubject("globex", "pay"))
	if err != nil || m.Header.Get(jobs.HeaderKey) != key {
		t.Fatalf("globex's decided call's job was not published: %+v %v", m, err)
	}

	// Untaken, the job's id is toolq's own: the sweep's repeat is dropped.
	args2 := json.RawMessage(`{"amount_cents":90001}`)
	key2, _ := jobs.Call{Tenant: "globex", ConversationID: "c", TurnIndex: 1, Tool: "refund", Args: args2}.Key()
	got, err = store.Claim(ctx, []ledger.Claim{{Key: key2, ConversationID: "c", TurnIndex: 1, Tool: "refund", ArgsDigest: "d2",
		ToolUseID: "toolu_2", Owner: "t", Lease: time.Minute, Token: "tok2"}})
	if err != nil || !got[0].Claimed {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := store.AwaitApproval(ctx, got[0].Row.Fence(), ledger.ApprovalInfo{Args: args2, Group: "finance", TTL: time.Hour}, "toolu_2"); err != nil {
		t.Fatal(err)
	}
	if _, err := offline.Decide(ctx, key2, ledger.Decision{Approve: true, By: "gina", Reason: "invoice 8"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	subject := jobs.TenantJobSubject("globex", "refund")
	before, _ := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	for range 2 {
		if _, _, err := svc.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	after, _ := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if n := after.State.Subjects[subject] - before.State.Subjects[subject]; n != 1 {
		t.Fatalf("two sweeps published the decided call's job %d times, want once", n)
	}
}
