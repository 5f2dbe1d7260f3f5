package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/worker"
)

// bigPayment is over approved_payment's threshold.
func bigPayment(invoice string) string {
	return `{"invoice_id":"` + invoice + `","amount_cents":90000,"currency":"EUR"}`
}

// pendingTwice publishes a payment that needs approval under two
// tool_use_ids (the turn retried) and waits for both pending answers.
func (e *env) pendingTwice(conv, invoice string) (key string, calls []*jobs.Job) {
	e.t.Helper()
	first := job(conv, 1, "approved_payment", bigPayment(invoice))
	second := *first
	second.ToolUseID = first.ToolUseID + "_retry"
	calls = []*jobs.Job{first, &second}
	for _, j := range calls {
		key = e.publish(j).Key
		if r := e.await(j); r.Status != jobs.StatusAwaitingApproval {
			e.t.Fatalf("%s: %+v %+v, want awaiting_approval", j.ToolUseID, r, r.Error)
		}
	}
	return key, calls
}

// finalOf waits for the final result of each call.
func (e *env) finalOf(calls []*jobs.Job) map[string]*jobs.Result {
	e.t.Helper()
	out := map[string]*jobs.Result{}
	testenv.Eventually(e.t, 60*time.Second, "every tool_use_id's final result", func() bool {
		for _, r := range e.results(calls[0].ConversationID) {
			if r.Status.Final() {
				out[r.ToolUseID] = r
			}
		}
		return len(out) == len(calls)
	})
	return out
}

// TestSIGKILLBetweenTheApprovalAndThePayment: a payment over the threshold,
// asked twice, waits for approval; once approved, the consumer that runs it
// is SIGKILLed at each point from its claim to its ack. Another consumer
// finishes: exactly one payment, and both tool_use_ids get the final
// result.
func TestSIGKILLBetweenTheApprovalAndThePayment(t *testing.T) {
	t.Parallel()
	for _, point := range []worker.FaultPoint{worker.AfterClaim, worker.DuringTool, worker.AfterComplete, worker.AfterPublish} {
		t.Run(string(point), func(t *testing.T) {
			t.Parallel()
			o := options{ackWait: time.Second}
			e := setup(t, o)
			first := e.startWorker(o, nil)
			key, calls := e.pendingTwice(conv(t), "inv-1")
			first.cancel()
			<-first.done
			first.done <- nil // for its cleanup
			h := e.startHelper(helperSpec{KillAt: string(point), KillTool: "approved_payment", AckWaitMS: 1000})
			svc, err := approvals.New(approvals.Config{Ledger: e.store, JS: e.js})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := svc.Decide(context.Background(), key, ledger.Decision{Approve: true, By: "alice", Reason: "invoice checked", Group: "finance"}); err != nil {
				t.Fatal(err)
			}
			last, err := h.wait(t, 30*time.Second)
			if last != "killed at "+string(point) || err == nil || !strings.Contains(err.Error(), "killed") {
				t.Fatalf("helper ended with %q, %v\n%s", last, err, e.logs.String())
			}
			e.startWorker(o, nil)
			final := e.finalOf(calls)
			for _, j := range calls {
				if r := final[j.ToolUseID]; r.Status != jobs.StatusOK || r.Approval == nil || r.Approval.DecidedBy != "alice" {
					t.Fatalf("%s: %+v", j.ToolUseID, r)
				}
			}
			if n := len(e.sandbox.Payments()); n != 1 {
				t.Fatalf("%d payments for one approved call", n)
			}
		})
	}
}

// TestADecisionWhoseAnnouncementWasLostIsCarriedOutByTheSweep: the
// deciding process stops after recording the approval and before
// publishing anything (the ledger's decision alone); a consumer's sweep
// publishes it: the payment is made once and both tool_use_ids are
// answered. The same for a denial: nothing is paid.
func TestADecisionWhoseAnnouncementWasLostIsCarriedOutByTheSweep(t *testing.T) {
	t.Parallel()
	o := options{ackWait: time.Second}
	e := setup(t, o)
	e.startWorker(o, nil)
	yes, yesCalls := e.pendingTwice(conv(t)+"-yes", "inv-yes")
	no, noCalls := e.pendingTwice(conv(t)+"-no", "inv-no")
	ctx := context.Background()
	if _, err := e.store.Decide(ctx, yes, ledger.Decision{Approve: true, By: "alice", Reason: "ok"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Decide(ctx, no, ledger.Decision{By: "bob", Reason: "no"}); err != nil {
		t.Fatal(err)
	}
	svc, err := approvals.New(approvals.Config{Ledger: e.store, JS: e.js, Unanswered: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The sweep ends with the test, before its ledger closes.
	sweepCtx, stopSweep := context.WithCancel(ctx)
	swept := make(chan struct{})
	go func() { defer close(swept); svc.Run(sweepCtx, 200*time.Millisecond) }()
	t.Cleanup(func() { stopSweep(); <-swept })
	for _, j := range yesCalls {
		if r := e.finalOf(yesCalls)[j.ToolUseID]; r.Status != jobs.StatusOK {
			t.Fatalf("approved %s: %+v", j.ToolUseID, r)
		}
	}
	for _, j := range noCalls {
		if r := e.finalOf(noCalls)[j.ToolUseID]; r.Status != jobs.StatusDenied {
			t.Fatalf("denied %s: %+v", j.ToolUseID, r)
		}
	}
	if n := len(e.sandbox.Payments()); n != 1 {
		t.Fatalf("%d payments, want the approved one", n)
	}
}
