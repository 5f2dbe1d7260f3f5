package integration

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// TestADecisionWithoutTenantsNeverAnnouncesATenantsCallAsTheDefaults: a
// process that decides calls without the tenants configured (`consumer
// approve` whose stream listing found none, a consumer started without
// --tenants on the shared ledger) must not announce globex's call on the
// default tenant's subjects: not its approval event (globex's args, who
// decided, why) in TOOLQ_APPROVALS, nor its job on toolq.jobs.<tool>.
func TestADecisionWithoutTenantsNeverAnnouncesATenantsCallAsTheDefaults(t *testing.T) {
	p := startTenants(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	globex := p.connect("globex", "_INBOX_globex")
	globexClient := jobs.NewClient(globex.js, jobs.WithTenant("globex"))
	asked, err := globexClient.PublishAndAwait(ctx, &jobs.Job{ConversationID: "conv-g", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_1",
		Args: json.RawMessage(`{"to":"acct_globex_secret","amount_cents":90000}`)})
	if err != nil || asked.Status != jobs.StatusAwaitingApproval {
		t.Fatalf("globex's call: %+v %v", asked, err)
	}
	cli, err := approvals.New(approvals.Config{Ledger: p.stack.Store, JS: p.stack.JS}) // no tenants known
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Decide(ctx, asked.Key, ledger.Decision{Approve: true, By: "ops", Reason: "invoice 7"}); err != nil {
		t.Logf("decide: %v", err)
	}
	time.Sleep(time.Second)
	for _, c := range []struct{ stream, subject string }{
		{jobs.ApprovalsStream, jobs.ApprovalSubject("conv-g")},
		{jobs.JobsStream, jobs.JobSubject("pay")},
	} {
		s, err := p.consumer.js.Stream(ctx, c.stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(c.subject))
		if err != nil {
			t.Fatal(err)
		}
		if n := info.State.Subjects[c.subject]; n != 0 {
			t.Errorf("globex's call announced on the default tenant's %s in %s (%d messages)", c.subject, c.stream, n)
		}
	}

	// The consumer that serves globex sweeps: its job goes out again on
	// globex's subject, and globex's waiter gets its answer.
	right, err := approvals.New(approvals.Config{Ledger: p.stack.Store, JS: p.stack.JS, Tenants: []string{"acme", "globex"}, Unanswered: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, again, err := right.Sweep(ctx); err != nil || again != 1 {
		t.Logf("sweep: %d again, %v", again, err)
	}
	short, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	final, err := globexClient.Await(short, "conv-g", "toolu_1", jobs.UntilFinal())
	if err != nil || final.Status != jobs.StatusOK {
		t.Errorf("globex's approved call after the sweep: %+v %v", final, err)
	}
}
