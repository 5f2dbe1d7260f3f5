package approvals_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// TestASweepReachesADecisionBehindAHundredItCannotAnnounce: a
// consumer serving acme (besides the default tenant) shares the ledger with
// consumers serving globex (docs/tenants.md: a row of no tenant of a
// consumer's "is announced by no one but the sweep of a consumer that
// serves its tenant"). 100 globex calls were decided while NATS was out
// (`consumer approve`), and the globex consumers are down. Then one acme
// call is decided the same way. docs/approvals.md: "Each consumer's sweep
// publishes the job again for a decided call that still has waiters without
// their final answer 30 s after the decision." The acme consumer's sweep
// cannot announce the globex rows; it must page on past them to acme's,
// or its decision is never announced, its call never runs and its agent is
// never answered, for as long as the globex rows wait.
func TestASweepReachesADecisionBehindAHundredItCannotAnnounce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js, store := broker(t, "acme", "globex")
	offline, err := approvals.New(approvals.Config{Ledger: store, Tenants: []string{"acme", "globex"}})
	if err != nil {
		t.Fatal(err)
	}
	args := json.RawMessage(`{"amount_cents":90000}`)
	keyOf := func(tenant string, turn int64) string {
		key, err := jobs.Call{Tenant: tenant, ConversationID: "c", TurnIndex: turn, Tool: "pay", Args: args}.Key()
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	decided := func(tenant string, turn int64) string {
		key := awaitingCall(t, store, jobs.Call{Tenant: tenant, ConversationID: "c", TurnIndex: turn, Tool: "pay", Args: args}, time.Hour)
		if _, err := offline.Decide(ctx, key, ledger.Decision{Approve: true, By: "gina", Reason: "ok"}); err != nil {
			t.Fatal(err)
		}
		return key
	}
	// The globex calls come first by age and by key, whichever a sweep
	// reads the unanswered calls in.
	acmeTurn := int64(1000)
	for keyOf("acme", acmeTurn) < "c" {
		acmeTurn++
	}
	for turn, n := int64(0), 0; n < 100; turn++ {
		if keyOf("globex", turn) < keyOf("acme", acmeTurn) {
			decided("globex", turn)
			n++
		}
	}
	time.Sleep(20 * time.Millisecond)
	acme := decided("acme", acmeTurn)
	time.Sleep(20 * time.Millisecond)
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Tenants: []string{"acme"}, Unanswered: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		svc.Sweep(ctx)
	}
	s, _ := js.Stream(ctx, jobs.JobsStream)
	m, err := s.GetLastMsgForSubject(ctx, jobs.TenantJobSubject("acme", "pay"))
	if err != nil || m.Header.Get(jobs.HeaderKey) != acme {
		t.Fatalf("three sweeps of the acme consumer never announced acme's decided call (%v): it starves behind 100 globex decisions it cannot announce", err)
	}
}

// TestASweepGoesOnFromWhereTheLastOneStopped: each sweep reads up to a
// thousand unanswered decisions, and the next goes on from where it
// stopped (docs/approvals.md). 1000 globex decisions the acme consumer
// cannot announce come before acme's by key: the first sweep reads only
// them, the next goes on past them to acme's. (A hundred, as above, fit in
// one sweep and would not tell.)
func TestASweepGoesOnFromWhereTheLastOneStopped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{Tenants: []string{"acme", "globex"}}); err != nil {
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
	offline, err := approvals.New(approvals.Config{Ledger: store, Tenants: []string{"acme", "globex"}})
	if err != nil {
		t.Fatal(err)
	}
	args := json.RawMessage(`{"amount_cents":90000}`)
	keyOf := func(tenant string, turn int64) string {
		key, err := jobs.Call{Tenant: tenant, ConversationID: "c", TurnIndex: turn, Tool: "pay", Args: args}.Key()
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	decided := func(tenant string, turn int64) string {
		key := keyOf(tenant, turn)
		got, err := store.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: "c", TurnIndex: turn, Tool: "pay", ArgsDigest: "d",
			ToolUseID: "toolu_1", Owner: "t", Lease: time.Minute, Token: key}})
		if err != nil || !got[0].Claimed {
			t.Fatalf("%+v %v", got, err)
		}
		if _, err := store.AwaitApproval(ctx, got[0].Row.Fence(), ledger.ApprovalInfo{Args: args, Group: "finance", TTL: time.Hour}, "toolu_1"); err != nil {
			t.Fatal(err)
		}
		if _, err := offline.Decide(ctx, key, ledger.Decision{Approve: true, By: "gina", Reason: "ok"}); err != nil {
			t.Fatal(err)
		}
		return key
	}
	acmeTurn := int64(100000)
	for keyOf("acme", acmeTurn) < "f" {
		acmeTurn++
	}
	for turn, n := int64(0), 0; n < 1000; turn++ {
		if keyOf("globex", turn) < keyOf("acme", acmeTurn) {
			decided("globex", turn)
			n++
		}
	}
	acme := decided("acme", acmeTurn)
	time.Sleep(20 * time.Millisecond)
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Tenants: []string{"acme"}, Unanswered: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		svc.Sweep(ctx)
	}
	s, _ := js.Stream(ctx, jobs.JobsStream)
	m, err := s.GetLastMsgForSubject(ctx, jobs.TenantJobSubject("acme", "pay"))
	if err != nil || m.Header.Get(jobs.HeaderKey) != acme {
		t.Fatalf("three sweeps never announced acme's decided call behind 1000 globex ones (%v)", err)
	}
}
