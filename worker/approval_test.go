package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// payments is a keyed write that needs approval above 500.00, counting its
// calls by amount.
type payments struct {
	mu   sync.Mutex
	runs map[string]int // by key
	n    atomic.Int32
}

func (p *payments) registry(t *testing.T, ttl time.Duration) *tools.Registry {
	t.Helper()
	p.runs = map[string]int{}
	pay := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		p.mu.Lock()
		p.runs[r.Key]++
		p.mu.Unlock()
		p.n.Add(1)
		return json.RawMessage(fmt.Sprintf(`{"paid":true,"key":%q}`, r.Key)), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Executor: pay,
		Schema:   json.RawMessage(`{"type":"object","properties":{"amount_cents":{"type":"integer"},"to":{"type":"string"}}}`),
		Approval: &tools.Approval{When: "args.amount_cents > 50000", TTL: ttl, Group: "finance"}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// resultsOf reads every result published so far in a conversation, in
// order, until want of them have come or the deadline.
func resultsOf(t *testing.T, js jetstream.JetStream, conv string, want int) []*jobs.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, jobs.ResultsStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{jobs.ResultSubject(conv)}})
	if err != nil {
		t.Fatal(err)
	}
	var out []*jobs.Result
	for len(out) < want {
		msg, err := cons.Next(jetstream.FetchMaxWait(time.Until(deadlineOf(ctx))))
		if err != nil {
			t.Fatalf("%d results of %d in %s: %v (got %v)", len(out), want, conv, err, statuses(out))
		}
		r, err := jobs.DecodeResult(msg.Data())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func deadlineOf(ctx context.Context) time.Time { d, _ := ctx.Deadline(); return d }

func statuses(rs []*jobs.Result) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ToolUseID+":"+string(r.Status))
	}
	return out
}

// approvalEvents counts the events of a conversation in TOOLQ_APPROVALS.
func approvalEvents(t *testing.T, js jetstream.JetStream, conv string) map[string]int {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, jobs.ApprovalsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		msg, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		var ev jobs.ApprovalEvent
		if err := json.Unmarshal(msg.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.ConversationID == conv {
			out[ev.Event]++
		}
	}
	return out
}

func publish(t *testing.T, js jetstream.JetStream, j *jobs.Job) string {
	t.Helper()
	p, err := jobs.NewClient(js).Publish(context.Background(), j)
	if err != nil {
		t.Fatal(err)
	}
	return p.Key
}

// TestAnApprovedCallRunsOnceAndEveryToolUseIDThatAskedGetsItsResult: the
// call over the threshold is answered awaiting_approval at once, its
// duplicate (a retried turn) joins it without a second request, and once
// approved it runs once and both tool_use_ids get the final result; a
// call under the threshold runs without asking.
func TestAnApprovedCallRunsOnceAndEveryToolUseIDThatAskedGetsItsResult(t *testing.T) {
	t.Parallel()
	var p payments
	js, store := startWorker(t, p.registry(t, time.Hour), worker.Config{})
	ctx := context.Background()
	call := jobs.Job{ConversationID: "conv-approve", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_1",
		Args: json.RawMessage(`{"to":"acct_9","amount_cents":90000}`)}
	key := publish(t, js, &call)
	first := resultsOf(t, js, "conv-approve", 1)[0]
	if first.Status != jobs.StatusAwaitingApproval || first.Status.Final() || first.Key != key || first.Approval == nil ||
		string(first.Approval.Args) != `{"amount_cents":90000,"to":"acct_9"}` || first.Approval.Group != "finance" ||
		time.Until(first.Approval.ExpiresAt) < 59*time.Minute || first.Approval.ArgsDigest == "" {
		t.Fatalf("first answer: %+v %+v", first, first.Approval)
	}
	retried := call
	retried.ToolUseID = "toolu_2"
	publish(t, js, &retried)
	second := resultsOf(t, js, "conv-approve", 2)[1]
	if second.ToolUseID != "toolu_2" || second.Status != jobs.StatusAwaitingApproval || !second.Duplicate || second.OriginalToolUseID != "toolu_1" {
		t.Fatalf("the retried turn's answer: %+v", second)
	}
	if ev := approvalEvents(t, js, "conv-approve"); ev[jobs.ApprovalRequested] != 1 {
		t.Fatalf("approval events %v: want one request", ev)
	}
	if p.n.Load() != 0 {
		t.Fatal("the call ran before it was approved")
	}
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Decide(ctx, key, ledger.Decision{Approve: true, By: "alice", Reason: "invoice 42", Group: "finance", Digest: first.Approval.ArgsDigest}); err != nil {
		t.Fatal(err)
	}
	final := map[string]*jobs.Result{}
	for _, r := range resultsOf(t, js, "conv-approve", 4)[2:] {
		final[r.ToolUseID] = r
	}
	for _, id := range []string{"toolu_1", "toolu_2"} {
		r := final[id]
		if r == nil || r.Status != jobs.StatusOK || r.Approval == nil || r.Approval.Decision != "approved" || r.Approval.DecidedBy != "alice" {
			t.Fatalf("final result of %s: %+v", id, r)
		}
	}
	if p.n.Load() != 1 || p.runs[key] != 1 {
		t.Fatalf("the approved call ran %d times", p.n.Load())
	}
	if ev := approvalEvents(t, js, "conv-approve"); ev[jobs.ApprovalApproved] != 1 {
		t.Fatalf("approval events %v", ev)
	}
	testenv.Eventually(t, 10*time.Second, "the waiters recorded answered", func() bool {
		row, err := store.Get(ctx, key)
		return err == nil && row.State == ledger.Completed && len(row.Waiters) == 0
	})
	// A later retry of the same call needs no second approval.
	again := call
	again.ToolUseID = "toolu_3"
	publish(t, js, &again)
	if r := resultsOf(t, js, "conv-approve", 5)[4]; r.Status != jobs.StatusOK || !r.Duplicate {
		t.Fatalf("a retry after the approval: %+v", r)
	}
	// Under the threshold: no approval.
	small := jobs.Job{ConversationID: "conv-approve", TurnIndex: 2, Tool: "pay", ToolUseID: "toolu_4", Args: json.RawMessage(`{"to":"acct_9","amount_cents":100}`)}
	publish(t, js, &small)
	if r := resultsOf(t, js, "conv-approve", 6)[5]; r.Status != jobs.StatusOK || r.Approval != nil {
		t.Fatalf("a call under the threshold: %+v", r)
	}
	if p.n.Load() != 2 {
		t.Fatalf("%d payments, want 2", p.n.Load())
	}
}

// TestADeniedCallNeverRunsAndAnotherAmountIsAnotherApproval.
func TestADeniedCallNeverRunsAndAnotherAmountIsAnotherApproval(t *testing.T) {
	t.Parallel()
	var p payments
	js, store := startWorker(t, p.registry(t, time.Hour), worker.Config{})
	ctx := context.Background()
	a := jobs.Job{ConversationID: "conv-deny", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_a", Args: json.RawMessage(`{"to":"acct_1","amount_cents":60000}`)}
	b := a
	b.ToolUseID, b.Args = "toolu_b", json.RawMessage(`{"to":"acct_1","amount_cents":60001}`)
	b.Ordinal = 1
	ka, kb := publish(t, js, &a), publish(t, js, &b)
	if ka == kb {
		t.Fatal("two amounts, one key")
	}
	resultsOf(t, js, "conv-deny", 2)
	if ev := approvalEvents(t, js, "conv-deny"); ev[jobs.ApprovalRequested] != 2 {
		t.Fatalf("events %v: want a request per amount", ev)
	}
	svc, _ := approvals.New(approvals.Config{Ledger: store, JS: js})
	if _, err := svc.Decide(ctx, ka, ledger.Decision{By: "bob", Reason: "not on the invoice"}); err != nil {
		t.Fatal(err)
	}
	r := resultsOf(t, js, "conv-deny", 3)[2]
	if r.ToolUseID != "toolu_a" || r.Status != jobs.StatusDenied || r.Error == nil || r.Error.Code != ledger.CodeApprovalDenied ||
		r.Approval == nil || r.Approval.Reason != "not on the invoice" {
		t.Fatalf("denied result: %+v %+v", r, r.Approval)
	}
	// Deciding it again is refused, and it still never runs.
	if _, err := svc.Decide(ctx, ka, ledger.Decision{Approve: true, By: "carol", Reason: "oops"}); err == nil {
		t.Fatal("a second decision stood")
	}
	retried := a
	retried.ToolUseID = "toolu_a2"
	publish(t, js, &retried)
	if r := resultsOf(t, js, "conv-deny", 4)[3]; r.Status != jobs.StatusDenied {
		t.Fatalf("a retry of the denied call: %+v", r)
	}
	if p.n.Load() != 0 {
		t.Fatalf("a denied or undecided call ran %d times", p.n.Load())
	}
	if row, _ := store.Get(ctx, kb); row.State != ledger.AwaitingApproval {
		t.Fatalf("the other amount: %s", row.State)
	}
}

// TestAnUndecidedCallExpiresNeverRunsAndItsWaitersAreTold.
func TestAnUndecidedCallExpiresNeverRunsAndItsWaitersAreTold(t *testing.T) {
	t.Parallel()
	var p payments
	js, _ := startWorker(t, p.registry(t, time.Second), worker.Config{ApprovalSweep: 100 * time.Millisecond})
	a := jobs.Job{ConversationID: "conv-expire", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_x", Args: json.RawMessage(`{"amount_cents":99999}`)}
	publish(t, js, &a)
	a.ToolUseID = "toolu_y"
	publish(t, js, &a)
	got := resultsOf(t, js, "conv-expire", 4)
	final := map[string]jobs.Status{}
	for _, r := range got[2:] {
		final[r.ToolUseID] = r.Status
	}
	if final["toolu_x"] != jobs.StatusExpired || final["toolu_y"] != jobs.StatusExpired {
		t.Fatalf("results %v", statuses(got))
	}
	if p.n.Load() != 0 {
		t.Fatal("an expired call ran")
	}
	testenv.Eventually(t, 5*time.Second, "the expiry event", func() bool { return approvalEvents(t, js, "conv-expire")[jobs.ApprovalExpired] == 1 })
}
