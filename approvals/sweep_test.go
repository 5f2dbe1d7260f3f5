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
