package approvals_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	js, svc, acme := decidedBehind(t, 100, "c")
	for range 3 {
		svc.Sweep(context.Background())
	}
	if err := announced(js, acme); err != nil {
		t.Fatalf("three sweeps of the acme consumer never announced acme's decided call (%v): it starves behind 100 globex decisions it cannot announce", err)
	}
}

// decidedBehind decides n globex calls while no consumer announces them,
// then one acme call whose key is at least from (the globex ones come
// first by age and by key, whichever a sweep reads the unanswered calls
// in), and returns the acme consumer's approvals service (its sweep on
// every call) and the acme call's key.
func decidedBehind(t *testing.T, n int, from string) (jetstream.JetStream, *approvals.Service, string) {
	t.Helper()
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
	acmeTurn := int64(100000)
	for keyOf("acme", acmeTurn) < from {
		acmeTurn++
	}
	for turn, k := int64(0), 0; k < n; turn++ {
		if keyOf("globex", turn) < keyOf("acme", acmeTurn) {
			decided("globex", turn)
			k++
		}
	}
	time.Sleep(20 * time.Millisecond)
	acme := decided("acme", acmeTurn)
	time.Sleep(20 * time.Millisecond)
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Tenants: []string{"acme"}, Unanswered: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return js, svc, acme
}

// announced says whether acme's last job is the call of key.
func announced(js jetstream.JetStream, key string) error {
	ctx := context.Background()
	s, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		return err
	}
	m, err := s.GetLastMsgForSubject(ctx, jobs.TenantJobSubject("acme", "pay"))
	if err != nil {
		return err
	}
	if got := m.Header.Get(jobs.HeaderKey); got != key {
		return fmt.Errorf("acme's last job is the call of %s", got)
	}
	return nil
}

// TestASweepGoesOnFromWhereTheLastOneStopped: each sweep reads up to a
// thousand unanswered decisions, and the next goes on from where it
// stopped (docs/approvals.md). 1000 globex decisions the acme consumer
// cannot announce come before acme's by key: the first sweep reads only
// them, the next goes on past them to acme's. (A hundred, as above, fit in
// one sweep and would not tell.)
func TestASweepGoesOnFromWhereTheLastOneStopped(t *testing.T) {
	t.Parallel()
	js, svc, acme := decidedBehind(t, 1000, "f")
	for range 3 {
		svc.Sweep(context.Background())
	}
	if err := announced(js, acme); err != nil {
		t.Fatalf("three sweeps never announced acme's decided call behind 1000 globex ones (%v)", err)
	}
}
