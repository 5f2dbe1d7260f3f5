package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// collectResults reads a conversation's results for d and returns them.
func collectResults(t *testing.T, js jetstream.JetStream, conv string, d time.Duration) []*jobs.Result {
	t.Helper()
	ctx := context.Background()
	cons, err := js.OrderedConsumer(ctx, jobs.ResultsStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{jobs.ResultSubject(conv)}})
	if err != nil {
		t.Fatal(err)
	}
	var out []*jobs.Result
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		msg, err := cons.Next(jetstream.FetchMaxWait(time.Until(end) + 10*time.Millisecond))
		if err != nil {
			if errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timeout") {
				break
			}
			t.Fatal(err)
		}
		r, err := jobs.DecodeResult(msg.Data())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// finalByID is the last final result of each tool_use_id.
func finalByID(rs []*jobs.Result) map[string]*jobs.Result {
	out := map[string]*jobs.Result{}
	for _, r := range rs {
		if r.Status.Final() {
			out[r.ToolUseID] = r
		}
	}
	return out
}

// deadLetteredIDs counts the dead letters per tool_use_id of the job
// they carry.
func deadLetteredIDs(t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range deadLetters(t, js) {
		var j struct {
			ToolUseID string `json:"tool_use_id"`
		}
		_ = json.Unmarshal(m.Data, &j)
		out[j.ToolUseID]++
	}
	return out
}

// bigArgs is a payment over the threshold whose memo holds n numbers
// written 1e15: 5 bytes each as sent, 17 once canonical (1000000000000000).
func bigArgs(n int) json.RawMessage {
	var b strings.Builder
	b.WriteString(`{"to":"acct_9","amount_cents":90000,"memo":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("1e15")
	}
	b.WriteString(`]}`)
	return json.RawMessage(b.String())
}

// TestAnApprovedCallWhoseArgsGrowWhenCanonicalRunsOnceAndAnswersEveryone:
// a payment over the threshold, asked twice, whose args fit the consumer's
// body limit as sent (numbers written 1e15) but not once canonicalized:
// approved, it must make one payment and answer both tool_use_ids, and the
// sweep must not publish its job again and again.
func TestACallTooLargeToBeApprovedIsRefusedAtOnceAndEveryoneIsTold(t *testing.T) {
	t.Parallel()
	var p payments
	reg := p.registry(t, time.Hour)
	js, store := sharedEnv(t)
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Unanswered: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := runWorker(t, js, store, reg, worker.Config{Approvals: svc, ApprovalSweep: 200 * time.Millisecond,
		Streams: jobs.Streams{DuplicateWindow: time.Second}})
	defer stop()
	args := bigArgs(45000) // 225 KB as sent, under the 256 KiB body limit; 765 KB canonical
	if len(args) >= 250<<10 {
		t.Fatalf("args of %d bytes", len(args))
	}
	conv := "conv-grow"
	a := jobs.Job{ConversationID: conv, TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_a", Args: args}
	key := publish(t, js, &a)
	b := a
	b.ToolUseID = "toolu_b"
	publish(t, js, &b)
	for _, r := range resultsOf(t, js, conv, 2) {
		if r.Status != jobs.StatusError || r.Error == nil || r.Error.Code != "args_too_large_for_approval" {
			t.Fatalf("a call whose approval could not carry its args: %s %+v", r.Status, r.Error)
		}
	}
	time.Sleep(time.Second) // sweeps
	if ev := approvalEvents(t, js, conv); len(ev) != 0 || p.n.Load() != 0 || len(deadLetteredIDs(t, js)) != 0 {
		t.Fatalf("events %v, %d payments, dead letters %v; row: %s", ev, p.n.Load(), deadLetteredIDs(t, js), released(t, store, key))
	}
}

// TestADecisionWhoseReasonCannotTravelWithItsCallIsRefused: a decision
// over NATS (toolq.decide.<group>) carries a long reason. The request fits
// the broker's max payload, but the reason travels again in the approval
// event (with the args) and in every result, which would not fit: taken,
// the decision would be recorded and never announced, the approved call
// never run, its tool_use_id never answered, and no second decision taken
// (409). The promise: bad input gets a clear error and loses nothing; every
// job ends answered.
func TestADecisionWhoseReasonCannotTravelWithItsCallIsRefused(t *testing.T) {
	t.Parallel()
	var p payments
	js, store := startWorker(t, p.registry(t, time.Hour), worker.Config{ApprovalSweep: 200 * time.Millisecond})
	ctx := context.Background()
	// args of 200 KB: below the consumer's body limit (256 KiB) and the
	// room an approval has.
	memo := strings.Repeat("m", 200<<10)
	call := jobs.Job{ConversationID: "conv-bigreason", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_1",
		Args: json.RawMessage(`{"to":"acct_9","amount_cents":90000,"memo":"` + memo + `"}`)}
	key := publish(t, js, &call)
	first := resultsOf(t, js, "conv-bigreason", 1)[0]
	if first.Status != jobs.StatusAwaitingApproval {
		t.Fatalf("first answer: %s %+v", first.Status, first.Error)
	}
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := svc.Serve(js.Conn())
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Stop()
	// A reason of 860 KiB: the request (~860 KiB) fits the 1 MiB max payload;
	// with the 200 KiB of args, the event and the results do not.
	req, _ := json.Marshal(jobs.DecisionRequest{Key: key, Decision: "approve", By: "alice", Reason: strings.Repeat("r", 860<<10)})
	msg, err := js.Conn().RequestMsg(&nats.Msg{Subject: jobs.DecidePrefix + "finance", Data: req}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var reply jobs.DecisionReply
	_ = json.Unmarshal(msg.Data, &reply)
	t.Logf("decision reply: status=%q error=%+v (Nats-Service-Error-Code %q)", reply.Status, reply.Error, msg.Header.Get("Nats-Service-Error-Code"))
	if reply.Error != nil {
		return // refused with a clear error: nothing lost
	}
	// Accepted: the approved call must run once and toolu_1 must get its
	// final result. Give the sweep (every 200 ms; waiters unanswered for
	// 30 s by default) its chance: 40 s.
	deadline := time.Now().Add(40 * time.Second)
	var final *jobs.Result
	for time.Now().Before(deadline) && final == nil {
		final = finalByID(collectResults(t, js, "conv-bigreason", 2*time.Second))["toolu_1"]
	}
	row, _ := store.ApprovedNotRun(ctx, key)
	st, _ := store.ApprovalStatusOf(ctx, key)
	if final == nil || p.n.Load() != 1 {
		t.Fatalf("the decision was answered %q, yet after 40 s the approved call ran %d times and toolu_1 has no final result (ledger: approval %q, state %q, waiters %v); a second decision: %v",
			reply.Status, p.n.Load(), st, row.State, row.Waiters, cutErr(secondDecision(svc, key)))
	}
}

func secondDecision(svc *approvals.Service, key string) error {
	_, err := svc.Decide(context.Background(), key, ledger.Decision{Approve: true, By: "bob", Reason: "again"})
	return err
}

func cutErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	s := err.Error()
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// TestTheLongestDecisionOnTheLargestArgsAskedForIsAnnounced: args as large
// as an approval takes, and a denial whose who and why are as long as a
// decision takes and escape in JSON at their worst (control characters):
// the event and every result still fit the broker's payload, so the
// asker is told. A call whose args leave no room for that is refused at
// once instead, before anyone is asked.
func TestTheLongestDecisionOnTheLargestArgsAskedForIsAnnounced(t *testing.T) {
	t.Parallel()
	var p payments
	js, store := startWorker(t, p.registry(t, time.Hour), worker.Config{ApprovalSweep: 200 * time.Millisecond, MaxBodySize: 1 << 20})
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	payload := int(js.Conn().MaxPayload())
	asked := 0
	// Just under the room an approval had with no account of the decision
	// (refused now), and just under the room it has with it.
	for i, size := range []int{payload - 10<<10 - 100, payload - 24<<10 - 100} {
		conv := fmt.Sprintf("conv-longest-%d", i)
		memo := strings.Repeat("m", size-len(`{"amount_cents":90000,"to":""}`))
		call := jobs.Job{ConversationID: conv, TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_1",
			Args: json.RawMessage(`{"amount_cents":90000,"to":"` + memo + `"}`)}
		key := publish(t, js, &call)
		first := resultsOf(t, js, conv, 1)[0]
		if first.Status == jobs.StatusError && first.Error != nil && first.Error.Code == "args_too_large_for_approval" {
			continue // refused at once: nothing lost
		}
		if first.Status != jobs.StatusAwaitingApproval {
			t.Fatalf("args of %d bytes: %s %+v", size, first.Status, first.Error)
		}
		asked++
		d := ledger.Decision{By: strings.Repeat("\x01", ledger.MaxDecisionBy), Reason: strings.Repeat("\x01", ledger.MaxDecisionReason)}
		if _, err := svc.Decide(context.Background(), key, d); err != nil {
			t.Fatal(err)
		}
		var final *jobs.Result
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && final == nil; {
			final = finalByID(collectResults(t, js, conv, time.Second))["toolu_1"]
		}
		if final == nil || final.Status != jobs.StatusDenied {
			t.Fatalf("args of %d bytes, denied with the longest decision: no final result for toolu_1 (%v)", size, final)
		}
		if ev := approvalEvents(t, js, conv); ev[jobs.ApprovalDenied] != 1 {
			t.Fatalf("args of %d bytes: events %v, want the denial", size, ev)
		}
	}
	if asked == 0 {
		t.Fatal("no call was asked for: the test sizes its args for rooms an approval no longer has")
	}
}

// TestAnApprovedCallRefusedAfterTheDecisionIsNotPublishedForEver: a call
// awaits approval; meanwhile the tool's schema is tightened (a registry
// change, a consumer restarted with it). Approved, its job is refused
// (invalid_args) before any claim. Every tool_use_id that asked must get a
// final result, and the sweep must not publish the decided call's job and
// its approved event again and again.
func TestAnApprovedCallRefusedAfterTheDecisionIsNotPublishedForEver(t *testing.T) {
	t.Parallel()
	var p payments
	js, store := sharedEnv(t)
	streams := jobs.Streams{DuplicateWindow: time.Second}
	stop := runWorker(t, js, store, p.registry(t, time.Hour), worker.Config{ApprovalSweep: -1, Streams: streams})
	conv := "conv-refused"
	a := jobs.Job{ConversationID: conv, TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_a", Args: json.RawMessage(`{"to":"acct_9","amount_cents":90000}`)}
	key := publish(t, js, &a)
	b := a
	b.ToolUseID = "toolu_b"
	publish(t, js, &b)
	resultsOf(t, js, conv, 2)
	stop()

	tightened, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite,
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			p.n.Add(1)
			return json.RawMessage(`{"paid":true}`), nil
		}),
		Schema:   json.RawMessage(`{"type":"object","properties":{"amount_cents":{"type":"integer","maximum":80000},"to":{"type":"string"}}}`),
		Approval: &tools.Approval{When: "args.amount_cents > 50000", TTL: time.Hour, Group: "finance"}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Unanswered: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop = runWorker(t, js, store, tightened, worker.Config{Approvals: svc, ApprovalSweep: 200 * time.Millisecond, Streams: streams})
	defer stop()
	if _, err := svc.Decide(context.Background(), key, ledger.Decision{Approve: true, By: "alice", Reason: "ok", Group: "finance"}); err != nil {
		t.Fatal(err)
	}
	rs := collectResults(t, js, conv, 6*time.Second)
	final := finalByID(rs)
	rejected := 0
	for _, r := range rs {
		if r.Status == jobs.StatusRejected {
			rejected++
		}
	}
	ev := approvalEvents(t, js, conv)
	if final["toolu_a"] == nil || final["toolu_b"] == nil || ev[jobs.ApprovalApproved] != 1 || rejected > 1 {
		t.Fatalf("final results %v; %d rejected results; %d approved events (want 1); row: %s",
			keysOf(final), rejected, ev[jobs.ApprovalApproved], released(t, store, key))
	}
}

// TestEveryToolUseIDOfAnApprovedCallThatCannotBeSentEndsWithAResultOrADeadLetter:
// approved, the payment's downstream refuses it before anything is sent,
// until the delivery limit. The job of the first tool_use_id (toolq's
// re-publication) is dead-lettered; the retried turn's tool_use_id, whose
// own job was acknowledged with the pending answer, must end too: with a
// final result or a dead letter, not silence.
func TestEveryToolUseIDOfAnApprovedCallThatCannotBeSentEndsWithAResultOrADeadLetter(t *testing.T) {
	t.Parallel()
	var sent atomic.Int32
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite,
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			sent.Add(1)
			return nil, tools.NotSentError("unavailable", "connection refused", 10*time.Millisecond, nil)
		}),
		Schema:   json.RawMessage(`{"type":"object","properties":{"amount_cents":{"type":"integer"}}}`),
		Approval: &tools.Approval{When: "args.amount_cents > 50000", TTL: time.Hour, Group: "finance"}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := sharedEnv(t)
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Unanswered: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := runWorker(t, js, store, reg, worker.Config{Approvals: svc, ApprovalSweep: 200 * time.Millisecond,
		RetryDelay: 10 * time.Millisecond, Consumer: worker.Consumer{MaxDeliver: 2}})
	defer stop()
	conv := "conv-notsent"
	a := jobs.Job{ConversationID: conv, TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_a", Args: json.RawMessage(`{"amount_cents":90000}`)}
	key := publish(t, js, &a)
	b := a
	b.ToolUseID = "toolu_b"
	publish(t, js, &b)
	resultsOf(t, js, conv, 2)
	if _, err := svc.Decide(context.Background(), key, ledger.Decision{Approve: true, By: "alice", Reason: "ok", Group: "finance"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 40*time.Second, "the approved call dead-lettered", func() bool { return len(deadLetteredIDs(t, js)) > 0 })
	final := finalByID(collectResults(t, js, conv, 4*time.Second))
	dead := deadLetteredIDs(t, js)
	for _, id := range []string{"toolu_a", "toolu_b"} {
		if final[id] == nil && dead[id] == 0 {
			t.Errorf("%s: neither a final result nor a dead letter (sent %d times; dead letters %v; row: %s)",
				id, sent.Load(), dead, released(t, store, key))
		}
	}
}

// TestADenialIsNotCountedAsASuppressedDuplicate: one call, asked once,
// denied. No duplicate of it was ever sent, so toolq.duplicates.suppressed
// must stay at zero; the denial's own re-publication is toolq's, not a
// duplicate delivery.
func TestADenialIsNotCountedAsASuppressedDuplicate(t *testing.T) {
	t.Parallel()
	var p payments
	reader := sdkmetric.NewManualReader()
	js, store := startWorker(t, p.registry(t, time.Hour), worker.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	ctx := context.Background()
	a := jobs.Job{ConversationID: "conv-metric", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_1", Args: json.RawMessage(`{"amount_cents":90000}`)}
	key := publish(t, js, &a)
	resultsOf(t, js, "conv-metric", 1)
	svc, _ := approvals.New(approvals.Config{Ledger: store, JS: js})
	if _, err := svc.Decide(ctx, key, ledger.Decision{By: "bob", Reason: "no", Group: "finance"}); err != nil {
		t.Fatal(err)
	}
	if r := resultsOf(t, js, "conv-metric", 2)[1]; r.Status != jobs.StatusDenied {
		t.Fatalf("%+v", r)
	}
	var rm metricdata.ResourceMetrics
	time.Sleep(500 * time.Millisecond) // the delivery is counted once JetStream is answered
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	if n := sumOf(rm, "toolq.duplicates.suppressed"); n != 0 {
		t.Fatalf("toolq.duplicates.suppressed = %d for one call asked once and denied", n)
	}
}

// TestOneCallWhoseAnnouncementCannotBePublishedDoesNotStopTheSweep: a
// consumer configured with a 512 KiB body limit (below the server's 1 MB
// max payload, as documented) takes a call over the threshold whose args
// (numbers written 1e15) grow past the max payload once canonical: its
// approval events cannot be published. It expires. Then an operator
// denies another call with the CLI while NATS is out (the ledger alone):
// the sweep must announce that denial to its waiter. One call whose
// announcement fails must not stop the sweep for every call after it.
func TestADecisionRecordedWithoutNATSIsAnnouncedBesideACallTooLargeToAsk(t *testing.T) {
	t.Parallel()
	var p payments
	reg := p.registry(t, time.Second)
	js, store := sharedEnv(t)
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Unanswered: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := runWorker(t, js, store, reg, worker.Config{Approvals: svc, ApprovalSweep: 200 * time.Millisecond,
		MaxBodySize: 512 << 10, RetryDelay: 10 * time.Millisecond, Consumer: worker.Consumer{MaxDeliver: 2}})
	defer stop()
	ctx := context.Background()
	poison := jobs.Job{ConversationID: "conv-poison", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_p", Args: bigArgs(80000)} // 400 KB sent, 1.36 MB canonical
	publish(t, js, &poison)
	if r := resultsOf(t, js, "conv-poison", 1)[0]; r.Status != jobs.StatusError || r.Error.Code != "args_too_large_for_approval" {
		t.Fatalf("the large call: %+v", r)
	}
	// Another call, in another conversation, that a person denies with the
	// CLI while NATS is out: the decision is in the ledger alone.
	normal := jobs.Job{ConversationID: "conv-normal", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_n", Args: json.RawMessage(`{"amount_cents":90000}`)}
	key := publish(t, js, &normal)
	if r := resultsOf(t, js, "conv-normal", 1)[0]; r.Status != jobs.StatusAwaitingApproval {
		t.Fatalf("%+v", r)
	}
	if _, err := store.Decide(ctx, key, ledger.Decision{By: "bob", Reason: "no"}); err != nil {
		t.Fatal(err)
	}
	final := finalByID(collectResults(t, js, "conv-normal", 6*time.Second))
	if r := final["toolu_n"]; r == nil || r.Status != jobs.StatusDenied {
		t.Fatalf("the denied call's waiter was never told (final results %v)", keysOf(final))
	}
}

// TestAnApprovedCallUnderItsLegacyKeyRunsOnceWithoutASecondRequest: a call
// whose args have member names that first differ above U+FFFF (👎 written
// before 👍) has a legacy key; its attempt from before the upgrade died in
// flight. After the upgrade its delivery takes it over under the legacy
// key and it asks for approval there. Approved, it must run once, under
// that approval: not ask a person a second time under its new key.
func TestAnApprovedCallUnderItsLegacyKeyRunsOnceWithoutASecondRequest(t *testing.T) {
	t.Parallel()
	var p payments
	js, store := sharedEnv(t)
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Unanswered: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := runWorker(t, js, store, p.registry(t, time.Hour), worker.Config{Approvals: svc, ApprovalSweep: 200 * time.Millisecond})
	defer stop()
	ctx := context.Background()
	conv := "conv-legacy"
	body := `{"version":1,"conversation_id":"` + conv + `","turn_index":1,"ordinal":0,"tool":"pay","tool_use_id":"toolu_a",` +
		`"args":{"amount_cents":90000,"👎":1,"👍":2}}`
	_, m, err := jobs.DecodeJobMaterial([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	legacy, ok := m.Legacy()
	if !ok {
		t.Fatal("no legacy key")
	}
	// The attempt from before the upgrade, in flight under the legacy key, its holder gone.
	if got, err := store.Claim(ctx, []ledger.Claim{{Key: legacy.Key(), ConversationID: conv, TurnIndex: 1, Tool: "pay",
		ArgsDigest: legacy.ArgsDigest(), ToolUseID: "toolu_a", Owner: "before-upgrade", Lease: time.Millisecond, Token: "old"}}); err != nil || !got[0].Claimed {
		t.Fatalf("%+v %v", got, err)
	}
	time.Sleep(10 * time.Millisecond)
	if _, err := js.Publish(ctx, jobs.JobSubject("pay"), []byte(body)); err != nil {
		t.Fatal(err)
	}
	first := resultsOf(t, js, conv, 1)[0]
	if first.Status != jobs.StatusAwaitingApproval || first.Key != legacy.Key() {
		t.Fatalf("first answer: %+v (legacy key %s, new key %s)", first, legacy.Key(), m.Key())
	}
	if _, err := svc.Decide(ctx, legacy.Key(), ledger.Decision{Approve: true, By: "alice", Reason: "ok", Group: "finance"}); err != nil {
		t.Fatal(err)
	}
	rs := collectResults(t, js, conv, 5*time.Second)
	ev := approvalEvents(t, js, conv)
	if p.n.Load() != 1 || ev[jobs.ApprovalRequested] != 1 {
		t.Fatalf("approved once: %d payments (want 1), %d approval requests (want 1); results %v; the approved row: %s",
			p.n.Load(), ev[jobs.ApprovalRequested], statuses(rs), released(t, store, legacy.Key()))
	}
}

// TestARetriedTurnOfAnApprovedLegacyKeyCallRunsItWithoutAskingAgain: the
// call of TestAnApprovedCallUnderItsLegacyKeyRunsOnceWithoutASecondRequest
// (member names that first differ above U+FFFF: a legacy key), asked and
// approved under its legacy key. The decision is recorded by `consumer
// approve` while NATS is out, so the decided job waits for the sweep (as
// documented: within 30 s). Meanwhile the agent retries the turn (same
// args, new tool_use_id). docs/approvals.md: "A retried turn with the same
// args is the same key and does not ask again. The ledger runs an approved
// key once." The retried turn must find the approved legacy row (released,
// which Get does not return) and run it there, not claim the new key and
// ask a person a second time: approved again, the payment would be made
// twice, under two Idempotency-Keys.
func TestARetriedTurnOfAnApprovedLegacyKeyCallRunsItWithoutAskingAgain(t *testing.T) {
	t.Parallel()
	var p payments
	js, store := sharedEnv(t)
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Unanswered: 3 * time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := runWorker(t, js, store, p.registry(t, time.Hour), worker.Config{Approvals: svc, ApprovalSweep: 200 * time.Millisecond})
	defer stop()
	ctx := context.Background()
	conv := "conv-legacy-retry"
	body := func(id string) string {
		return `{"version":1,"conversation_id":"` + conv + `","turn_index":1,"ordinal":0,"tool":"pay","tool_use_id":"` + id + `",` +
			`"args":{"amount_cents":90000,"👎":1,"👍":2}}`
	}
	_, m, err := jobs.DecodeJobMaterial([]byte(body("toolu_a")))
	if err != nil {
		t.Fatal(err)
	}
	legacy, _ := m.Legacy()
	if got, err := store.Claim(ctx, []ledger.Claim{{Key: legacy.Key(), ConversationID: conv, TurnIndex: 1, Tool: "pay",
		ArgsDigest: legacy.ArgsDigest(), ToolUseID: "toolu_a", Owner: "before-upgrade", Lease: time.Millisecond, Token: "old"}}); err != nil || !got[0].Claimed {
		t.Fatalf("%+v %v", got, err)
	}
	time.Sleep(10 * time.Millisecond)
	if _, err := js.Publish(ctx, jobs.JobSubject("pay"), []byte(body("toolu_a"))); err != nil {
		t.Fatal(err)
	}
	if first := resultsOf(t, js, conv, 1)[0]; first.Status != jobs.StatusAwaitingApproval || first.Key != legacy.Key() {
		t.Fatalf("first answer: %+v", first)
	}
	// `consumer approve` with NATS out: recorded in the ledger only.
	offline, err := approvals.New(approvals.Config{Ledger: store, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := offline.Decide(ctx, legacy.Key(), ledger.Decision{Approve: true, By: "alice", Reason: "ok"}); err != nil {
		t.Fatal(err)
	}
	// The retried turn, before the sweep announces the decision.
	if _, err := js.Publish(ctx, jobs.JobSubject("pay"), []byte(body("toolu_b"))); err != nil {
		t.Fatal(err)
	}
	second := resultsOf(t, js, conv, 2)[1]
	if second.Status == jobs.StatusAwaitingApproval && second.Key != legacy.Key() {
		// A second request, for another key: the approver sees the same
		// args again. Approved, it runs again.
		if _, err := offline.Decide(ctx, second.Key, ledger.Decision{Approve: true, By: "bob", Reason: "looks like the invoice"}); err != nil {
			t.Fatal(err)
		}
	}
	rs := collectResults(t, js, conv, 8*time.Second)
	ev := approvalEvents(t, js, conv)
	p.mu.Lock()
	runs := len(p.runs)
	p.mu.Unlock()
	if second.Status == jobs.StatusAwaitingApproval || ev[jobs.ApprovalRequested] != 1 || p.n.Load() != 1 {
		t.Fatalf("the retried turn of an approved call was answered %s under key %s (legacy key %s, new key %s); %d approval requests (want 1); %d payments under %d keys (want 1); results %v",
			second.Status, second.Key, legacy.Key(), m.Key(), ev[jobs.ApprovalRequested], p.n.Load(), runs, statuses(rs))
	}
}

// released describes key's row when it is released (approved, not run
// since), as the approvals sweep sees it, or says the sweep does not.
func released(t *testing.T, store *ledger.Store, key string) string {
	t.Helper()
	rows, err := store.UnansweredApprovals(context.Background(), 0, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Key == key {
			return fmt.Sprintf("%s at attempt %d, approval %s, waiters %v, published again by every sweep", r.State, r.Attempt, r.ApprovalStatus, r.Waiters)
		}
	}
	if r, err := store.Get(context.Background(), key); err == nil {
		return fmt.Sprintf("%s, waiters %v", r.State, r.Waiters)
	}
	return "released, and not among the sweep's unanswered approvals"
}

func keysOf(m map[string]*jobs.Result) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+":"+string(v.Status))
	}
	return out
}

// TestAnApprovedCallRefusedAfterTheDecisionIsNotPublishedForEver: a call
// awaits approval; meanwhile the tool's schema is tightened (a registry
// change, a consumer restarted with it). Approved, its job is refused
// (invalid_args) before any claim. Every tool_use_id that asked must get a
// final result, and the sweep must not publish the decided call's job and

// TestEveryToolUseIDOfAnApprovedCallWhoseOutputDoesNotFitBesideItsArgsIsAnswered:
// a call that asks approval with args well inside the room an approval
// takes (150 KiB of 1 MiB), asked twice (a retried turn joins as a
// waiter), approved; its output (900 KiB) would fit a result alone but not
// beside the approval (its args) that every result of the call carries.
// Every tool_use_id that asked ends with a final result, and the same one.
func TestEveryToolUseIDOfAnApprovedCallWhoseOutputDoesNotFitBesideItsArgsIsAnswered(t *testing.T) {
	t.Parallel()
	out := json.RawMessage(`{"blob":"` + strings.Repeat("o", 900<<10) + `"}`)
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) { return out, nil })
	reg := guardedPay(t, exec)
	js, store := startWorker(t, reg, worker.Config{ApprovalSweep: 200 * time.Millisecond, Logger: testLogger(t)})
	conv := "conv-rev2-bigout"
	key := askedTwice(t, js, conv)
	approve(t, js, store, key)
	var final map[string]*jobs.Result
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		final = finalByID(collectResults(t, js, conv, 2*time.Second))
		if final["toolu_1"] != nil && final["toolu_2"] != nil {
			break
		}
	}
	if final["toolu_1"] == nil || final["toolu_2"] == nil {
		row, _ := store.Get(context.Background(), key)
		t.Fatalf("final results %v; row %s waiters %v; dead letters %v", keysOf(final), row.State, row.Waiters, deadLetteredIDs(t, js))
	}
	if a, b := string(final["toolu_1"].Output), string(final["toolu_2"].Output); a != b || !strings.Contains(a, `"response_too_large":true`) {
		t.Fatalf("outputs differ or carry the whole output: %.80s / %.80s", a, b)
	}
}

// TestEveryToolUseIDOfAnApprovedCallIsAnsweredWhenTheResultsStreamRefusesItsArgs:
// the results stream's max message size (64 KiB) is lower than the
// server's, the case sendResult's smallest form is for. An approved call's
// args (150 KiB, inside the room an approval takes) travel in every result
// of the call, so a smallest form that only dropped the output was refused
// too. Every tool_use_id that asked gets a final result, the approval's
// args left out (args_too_large) and its decision kept.
func TestEveryToolUseIDOfAnApprovedCallIsAnsweredWhenTheResultsStreamRefusesItsArgs(t *testing.T) {
	t.Parallel()
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"ok":true}`), nil
	})
	reg := guardedPay(t, exec)
	js, store := startWorker(t, reg, worker.Config{ApprovalSweep: 200 * time.Millisecond, Logger: testLogger(t)})
	conv := "conv-args-refused"
	key := askedTwice(t, js, conv)
	ctx := context.Background()
	limitResults(t, js, 64<<10)
	approve(t, js, store, key)
	var final map[string]*jobs.Result
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		final = finalByID(collectResults(t, js, conv, 2*time.Second))
		if final["toolu_1"] != nil && final["toolu_2"] != nil {
			for id, r := range final {
				if a := r.Approval; a == nil || a.Decision != "approved" || !strings.Contains(string(a.Args), `"args_too_large":true`) {
					t.Fatalf("%s's final result: %s, approval %+v; want its decision, the args left out", id, r.Status, a)
				}
			}
			return
		}
	}
	row, _ := store.Get(ctx, key)
	t.Fatalf("final results %v; row %s waiters %v; dead letters %v", keysOf(final), row.State, row.Waiters, deadLetteredIDs(t, js))
}

// TestAnApprovedCallWhoseSmallestResultIsRefusedEndsInTheDLQ: a results
// stream whose max message size (256 bytes) refuses even a result without
// its output and approval args leaves the approved call's job unanswered,
// but not silently: each refusal is a counted retry, and the job ends in
// the DLQ at the delivery limit.
func TestAnApprovedCallWhoseSmallestResultIsRefusedEndsInTheDLQ(t *testing.T) {
	t.Parallel()
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"ok":true}`), nil
	})
	reg := guardedPay(t, exec)
	js, store := startWorker(t, reg, worker.Config{ApprovalSweep: 200 * time.Millisecond, Logger: testLogger(t),
		RetryDelay: 10 * time.Millisecond, Consumer: worker.Consumer{MaxDeliver: 3}})
	conv := "conv-smallest-refused"
	key := publish(t, js, &jobs.Job{ConversationID: conv, TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_1", Args: json.RawMessage(`{"amount_cents":90000}`)})
	if r := resultsOf(t, js, conv, 1)[0]; r.Status != jobs.StatusAwaitingApproval {
		t.Fatalf("first answer: %s %+v", r.Status, r.Error)
	}
	ctx := context.Background()
	limitResults(t, js, 256)
	approve(t, js, store, key)
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if deadLetteredIDs(t, js)["toolu_1"] > 0 {
			return
		}
	}
	row, _ := store.Get(ctx, key)
	t.Fatalf("no dead letter of the approved call whose every result the results stream refuses; row %s, final results %v", row.State, keysOf(finalByID(collectResults(t, js, conv, time.Second))))
}

// guardedPay is a registry of one keyed write, pay, run by exec, that asks
// finance's approval for more than 50,000 cents.
func guardedPay(t *testing.T, exec tools.Executor) *tools.Registry {
	t.Helper()
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Executor: exec,
		Schema:   json.RawMessage(`{"type":"object","properties":{"amount_cents":{"type":"integer"},"to":{"type":"string"}}}`),
		Approval: &tools.Approval{When: "args.amount_cents > 50000", TTL: time.Hour, Group: "finance"}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// askedTwice publishes a pay call with 150 KiB of args (inside the room
// an approval takes) as toolu_1 and again as toolu_2 (a retried turn,
// which joins as a waiter), each answered awaiting approval, and returns
// its key.
func askedTwice(t *testing.T, js jetstream.JetStream, conv string) string {
	t.Helper()
	call := jobs.Job{ConversationID: conv, TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_1",
		Args: json.RawMessage(`{"amount_cents":90000,"to":"` + strings.Repeat("a", 150<<10) + `"}`)}
	key := publish(t, js, &call)
	if r := resultsOf(t, js, conv, 1)[0]; r.Status != jobs.StatusAwaitingApproval {
		t.Fatalf("first answer: %s %+v", r.Status, r.Error)
	}
	retried := call
	retried.ToolUseID = "toolu_2"
	publish(t, js, &retried)
	if r := resultsOf(t, js, conv, 2)[1]; r.Status != jobs.StatusAwaitingApproval {
		t.Fatalf("retried turn: %s", r.Status)
	}
	return key
}

// limitResults lowers the results stream's max message size to size.
func limitResults(t *testing.T, js jetstream.JetStream, size int32) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, jobs.ResultsStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgSize = size
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// approve approves the call of key, as alice of finance.
func approve(t *testing.T, js jetstream.JetStream, store *ledger.Store, key string) {
	t.Helper()
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Decide(context.Background(), key, ledger.Decision{Approve: true, By: "alice", Reason: "ok"}); err != nil {
		t.Fatal(err)
	}
}
