package approvals_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/approvals"
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
	tenants := []string{"acme", "globex"}
	_, js, store := broker(t, tenants...)
	key := awaitingCall(t, store, jobs.Call{Tenant: "globex", ConversationID: "c", TurnIndex: 1, Tool: "pay", Args: json.RawMessage(`{"amount_cents":90000}`)}, time.Hour)
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
	key2 := awaitingCall(t, store, jobs.Call{Tenant: "globex", ConversationID: "c", TurnIndex: 1, Tool: "refund", Args: json.RawMessage(`{"amount_cents":90001}`)}, time.Hour)
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
