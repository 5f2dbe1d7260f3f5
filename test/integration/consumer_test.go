package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/worker"
)

// TestDuplicateCallIsAnsweredFromTheLedger: the retry of a turn emits the
// same call with a new tool_use_id; it gets the first call's output, marked
// duplicate, and the payment is made once.
func TestDuplicateCallIsAnsweredFromTheLedger(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			o := options{sqlite: backend == "sqlite"}
			e := setup(t, o)
			e.startWorker(o, nil)
			first := job(conv(t), 3, "send_payment", payment("inv_1"))
			p := e.publish(first)
			r1 := e.await(first)
			retry := job(conv(t), 3, "send_payment", `{"currency":"EUR","amount_cents":500.0,"invoice_id":"inv_1"}`)
			e.publish(retry)
			r2 := e.await(retry)
			if r1.Status != jobs.StatusOK || r1.Duplicate || r1.Key != p.Key {
				t.Fatalf("first result %+v", r1)
			}
			if r2.Status != jobs.StatusOK || !r2.Duplicate || r2.OriginalToolUseID != first.ToolUseID || string(r2.Output) != string(r1.Output) {
				t.Fatalf("duplicate result %+v", r2)
			}
			if n := len(e.sandbox.Payments()); n != 1 {
				t.Fatalf("%d payments", n)
			}
			if pay := e.sandbox.Payments()[0]; pay.IdempotencyKey != p.Key {
				t.Fatalf("downstream saw key %q, want %q", pay.IdempotencyKey, p.Key)
			}
			row := e.row(p.Key)
			if row.State != ledger.Completed || row.Attempt != 1 || row.FirstToolUseID != first.ToolUseID {
				t.Fatalf("row %+v", row)
			}
			info := e.settled()
			if info.NumRedelivered != 0 || info.AckFloor.Stream != 2 {
				t.Fatalf("JetStream: %+v", info)
			}
			if got := len(e.results(conv(t))); got != 2 {
				t.Fatalf("%d results", got)
			}
		})
	}
}

// TestTenDuplicatesAcrossThreeWorkers: the same call published 10 times with
// 10 tool_use_ids, concurrently, with 3 workers: one payment, ten results
// with identical output.
func TestTenDuplicatesAcrossThreeWorkers(t *testing.T) {
	t.Parallel()
	o := options{faults: sandbox.Faults{LatencyMS: 300}}
	e := setup(t, o)
	for range 3 {
		e.startWorker(o, nil)
	}
	var js []*jobs.Job
	var wg sync.WaitGroup
	for range 10 {
		j := job(conv(t), 1, "send_payment", payment("inv_10"))
		js = append(js, j)
		wg.Add(1)
		go func() { defer wg.Done(); e.publish(j) }()
	}
	wg.Wait()
	var outputs []string
	for _, j := range js {
		r := e.await(j)
		if r.Status != jobs.StatusOK {
			t.Fatalf("result %+v", r)
		}
		outputs = append(outputs, string(r.Output))
	}
	for _, o := range outputs {
		if o != outputs[0] {
			t.Fatalf("outputs differ: %q", outputs)
		}
	}
	if n := len(e.sandbox.Payments()); n != 1 {
		t.Fatalf("%d payments for one call", n)
	}
	e.settled()
}

// TestRawJSONFromAPlainClient: a job published by a NATS client with no
// toolq code (no headers at all) is processed.
func TestRawJSONFromAPlainClient(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	e.startWorker(options{}, nil)
	body := fmt.Sprintf(`{"version":1,"conversation_id":%q,"turn_index":0,"tool":"send_payment","tool_use_id":"toolu_raw","args":{"invoice_id":"raw","amount_cents":1,"currency":"USD"}}`, conv(t))
	if err := e.nc.Publish("toolq.jobs.send_payment", []byte(body)); err != nil {
		t.Fatal(err)
	}
	r := e.await(&jobs.Job{ConversationID: conv(t), ToolUseID: "toolu_raw"})
	if r.Status != jobs.StatusOK || len(e.sandbox.Payments()) != 1 {
		t.Fatalf("result %+v", r)
	}
}

// TestMalformedMessagesGoToTheDLQ: each is dead-lettered with its reason,
// terminated (not redelivered), and the worker goes on with the next good job.
func TestMalformedMessagesGoToTheDLQ(t *testing.T) {
	t.Parallel()
	o := options{maxBody: 4096}
	e := setup(t, o)
	e.startWorker(o, nil)
	good := `{"version":1,"conversation_id":"c","turn_index":0,"tool":"send_payment","tool_use_id":"toolu_x","args":{"invoice_id":"i","amount_cents":1,"currency":"EUR"}}`
	bad := []struct{ name, subject, body, reason string }{
		{"not JSON", "toolq.jobs.send_payment", "hello", jobs.DLQInvalid},
		{"wrong version", "toolq.jobs.send_payment", strings.Replace(good, `"version":1`, `"version":2`, 1), jobs.DLQInvalid},
		{"missing fields", "toolq.jobs.send_payment", `{"version":1,"tool":"send_payment"}`, jobs.DLQInvalid},
		{"bad tool_use_id", "toolq.jobs.send_payment", strings.Replace(good, "toolu_x", "toolu x", 1), jobs.DLQInvalid},
		{"negative turn", "toolq.jobs.send_payment", strings.Replace(good, `"turn_index":0`, `"turn_index":-1`, 1), jobs.DLQInvalid},
		{"subject wildcard in the conversation", "toolq.jobs.send_payment", strings.Replace(good, `"c"`, `"c.*"`, 1), jobs.DLQInvalid},
		{"duplicate member", "toolq.jobs.send_payment", strings.Replace(good, `"tool":"send_payment"`, `"tool":"send_payment","tool":"x"`, 1), jobs.DLQInvalid},
		{"subject of another tool", "toolq.jobs.create_ticket", good, jobs.DLQInvalid},
		{"over the size limit", "toolq.jobs.send_payment", strings.Replace(good, `"i"`, `"`+strings.Repeat("i", 5000)+`"`, 1), jobs.DLQTooLarge},
	}
	for i, b := range bad {
		msg := nats.NewMsg(b.subject)
		msg.Data = []byte(b.body)
		msg.Header.Set("X-Test", fmt.Sprint(i))
		if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	next := job(conv(t), 0, "send_payment", payment("after"))
	e.publish(next)
	if r := e.await(next); r.Status != jobs.StatusOK {
		t.Fatalf("the good job after the bad ones: %+v", r)
	}
	var dead []string
	testenv.Eventually(t, 10*time.Second, "every bad message dead-lettered", func() bool { return len(e.deadLetters()) == len(bad) })
	for _, m := range e.deadLetters() {
		i := 0
		fmt.Sscan(m.Headers().Get("X-Test"), &i)
		b := bad[i]
		h := m.Headers()
		if m.Subject() != jobs.DLQSubject(b.reason) || string(m.Data()) != b.body || h.Get(jobs.HeaderDLQReason) != b.reason ||
			h.Get(jobs.HeaderDLQDetail) == "" || h.Get(jobs.HeaderDLQDeliveries) != "1" || h.Get(jobs.HeaderDLQStreamSeq) != fmt.Sprint(i+1) ||
			h.Get(jobs.HeaderDLQSubject) != b.subject {
			t.Errorf("%s: dead letter %s %v", b.name, m.Subject(), h)
		}
		dead = append(dead, b.name+": "+h.Get(jobs.HeaderDLQDetail))
	}
	t.Logf("dead letters:\n%s", strings.Join(dead, "\n"))
	info := e.settled()
	if info.NumRedelivered != 0 {
		t.Fatalf("bad messages were redelivered: %+v", info)
	}
	if n := len(e.sandbox.Payments()); n != 1 {
		t.Fatalf("%d payments", n)
	}
}

// TestRejectedJobsRunNothing: unknown tool, args failing the schema, and a
// key header that does not match the call: a rejected result, nothing runs.
func TestRejectedJobsRunNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	e.startWorker(options{}, nil)
	unknown := job(conv(t), 0, "launch_rockets", `{}`)
	badArgs := job(conv(t), 0, "send_payment", `{"invoice_id":"i","amount_cents":"lots","currency":"EUR"}`)
	e.publish(unknown)
	e.publish(badArgs)
	forged := job(conv(t), 0, "send_payment", payment("forged"))
	body, _ := json.Marshal(forged)
	msg := nats.NewMsg("toolq.jobs.send_payment")
	msg.Data = body
	msg.Header.Set(jobs.HeaderKey, "00000000000000000000000000000000")
	if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	for j, code := range map[*jobs.Job]string{unknown: "unknown_tool", badArgs: "invalid_args", forged: "key_mismatch"} {
		r := e.await(j)
		if r.Status != jobs.StatusRejected || r.Error == nil || r.Error.Code != code {
			t.Errorf("%s: %+v", code, r)
		}
	}
	if len(e.sandbox.Payments()) != 0 {
		t.Fatal("a rejected job ran")
	}
	if rows, _ := e.store.List(context.Background(), ledger.Filter{}); len(rows) != 0 {
		t.Fatalf("rejected jobs left ledger rows: %+v", rows)
	}
	e.settled()
}

// TestReadToolsUseNoLedger: a read runs on every delivery and leaves no row.
func TestReadToolsUseNoLedger(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	e.startWorker(options{}, nil)
	pay := job(conv(t), 0, "send_payment", payment("inv_search"))
	e.publish(pay)
	e.await(pay)
	for range 2 {
		q := job(conv(t), 1, "search_orders", `{"query":"inv_search"}`)
		p := e.publish(q)
		r := e.await(q)
		if r.Status != jobs.StatusOK || r.Duplicate || !strings.Contains(string(r.Output), "inv_search") {
			t.Fatalf("read result %+v", r)
		}
		if _, err := e.store.Get(context.Background(), p.Key); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("a read left a ledger row: %v", err)
		}
	}
	e.settled()
}

// TestInFlightDuplicateWaitsForTheFirstAttempt: a duplicate that arrives
// while the first attempt runs waits for it in process, and is answered as
// soon as it settles.
func TestInFlightDuplicateWaitsForTheFirstAttempt(t *testing.T) {
	t.Parallel()
	o := options{faults: sandbox.Faults{LatencyMS: 1000}}
	e := setup(t, o)
	rw := e.startWorker(o, nil)
	first := job(conv(t), 0, "send_payment", payment("slow"))
	p := e.publish(first)
	testenv.Eventually(t, 10*time.Second, "the first attempt in flight", func() bool {
		r, err := e.store.Get(context.Background(), p.Key)
		return err == nil && r.State == ledger.InFlight
	})
	dup := job(conv(t), 0, "send_payment", payment("slow"))
	e.publish(dup)
	r := e.await(dup)
	if !r.Duplicate || r.Status != jobs.StatusOK || len(e.sandbox.Payments()) != 1 {
		t.Fatalf("duplicate: %+v, %d payments", r, len(e.sandbox.Payments()))
	}
	statsWhen(t, rw, "the duplicate did not wait in process", func(s map[string]int64) bool { return s["duplicate"] == 1 })
	if s := rw.w.Stats().Snapshot(); s["retry"] != 0 || s["duplicate"] != 1 {
		t.Fatalf("the duplicate did not wait in process: %v", s)
	}
	e.settled()
}

// TestLongInFlightWaitIsNotDeadLettered: when the first attempt outlasts the
// in-process wait, the duplicate goes back to JetStream and comes again, as
// often as needed: waiting on another attempt never counts toward the
// dead-letter limit.
func TestLongInFlightWaitIsNotDeadLettered(t *testing.T) {
	t.Parallel()
	o := options{maxDeliver: 2, inFlight: 100 * time.Millisecond}
	e := setup(t, o)
	rw := e.startWorker(o, nil)
	first := job(conv(t), 0, "gated_write", `{"n":1}`)
	p := e.publish(first)
	testenv.Eventually(t, 10*time.Second, "the first attempt in flight", func() bool {
		r, err := e.store.Get(context.Background(), p.Key)
		return err == nil && r.State == ledger.InFlight
	})
	dup := job(conv(t), 0, "gated_write", `{"n":1}`)
	e.publish(dup)
	testenv.Eventually(t, 20*time.Second, "the duplicate to come back more often than max-deliver", func() bool {
		return rw.w.Stats().Snapshot()["retry"] > 3
	})
	close(e.gate)
	if r := e.await(dup); !r.Duplicate || r.Status != jobs.StatusOK {
		t.Fatalf("duplicate %+v", r)
	}
	e.settled()
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
}

// seedExpired leaves the ledger as a worker that died mid-call would: an
// in-flight row whose lease has expired.
func (e *env) seedExpired(j *jobs.Job) string {
	e.t.Helper()
	m, err := j.Call().Material()
	if err != nil {
		e.t.Fatal(err)
	}
	c := ledger.Claim{Key: m.Key(), ConversationID: j.ConversationID, TurnIndex: j.TurnIndex, Tool: j.Tool, Ordinal: j.Ordinal,
		ArgsDigest: m.ArgsDigest(), ToolUseID: "toolu_dead", Owner: "dead-worker", Lease: 50 * time.Millisecond}
	if _, err := e.store.Claim(context.Background(), []ledger.Claim{c}); err != nil {
		e.t.Fatal(err)
	}
	testenv.Eventually(e.t, 5*time.Second, "the seeded lease to expire", func() bool { r := e.row(c.Key); return r.LeaseExpired() })
	return c.Key
}

func TestExpiredLeaseOfAKeyedWriteIsTakenOver(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	j := job(conv(t), 0, "send_payment", payment("takeover"))
	key := e.seedExpired(j)
	e.startWorker(options{}, nil)
	e.publish(j)
	r := e.await(j)
	if r.Status != jobs.StatusOK || r.Attempts != 2 || !r.Duplicate || r.OriginalToolUseID != "toolu_dead" {
		t.Fatalf("result %+v", r)
	}
	if row := e.row(key); row.State != ledger.Completed || row.Attempt != 2 {
		t.Fatalf("row %+v", row)
	}
	if n := len(e.sandbox.Payments()); n != 1 || e.sandbox.Payments()[0].IdempotencyKey != key {
		t.Fatalf("%d payments", n)
	}
	if !strings.Contains(e.logs.String(), "took over an expired lease") {
		t.Fatal("the takeover was not logged")
	}
	e.settled()
}

func TestExpiredLeaseOfAnUnkeyedWriteIsIndeterminate(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	j := job(conv(t), 0, "create_ticket", `{"title":"refund","body":"order 7"}`)
	key := e.seedExpired(j)
	e.startWorker(options{}, nil)
	e.publish(j)
	r := e.await(j)
	if r.Status != jobs.StatusIndeterminate || r.Error == nil || r.Error.Code != "holder_lost" {
		t.Fatalf("result %+v", r)
	}
	if row := e.row(key); row.State != ledger.Indeterminate {
		t.Fatalf("row %+v", row)
	}
	if n := len(e.sandbox.Tickets()); n != 0 {
		t.Fatalf("an unkeyed write with an unknown outcome ran again: %d tickets", n)
	}
	e.settled()
}

// TestNotSentReleasesAndDeadLettersAfterTheLimit: a downstream that refuses
// connections: the claim is released every time (nothing happened), the job
// retried, and after MaxDeliver it goes to the DLQ with its history.
func TestNotSentReleasesAndDeadLettersAfterTheLimit(t *testing.T) {
	t.Parallel()
	o := options{maxDeliver: 3}
	e := setup(t, o)
	rw := e.startWorker(o, nil)
	j := job(conv(t), 0, "refused_payment", `{"n":1}`)
	p := e.publish(j)
	testenv.Eventually(t, 20*time.Second, "the job dead-lettered", func() bool { return len(e.deadLetters()) == 1 })
	m := e.deadLetters()[0]
	if m.Subject() != jobs.DLQSubject(jobs.DLQMaxDeliver) || m.Headers().Get(jobs.HeaderDLQDeliveries) != "3" ||
		!strings.Contains(m.Headers().Get(jobs.HeaderDLQDetail), "connection_refused") {
		t.Fatalf("dead letter %s %v", m.Subject(), m.Headers())
	}
	if _, err := e.store.Get(context.Background(), p.Key); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("the claim of a call that was never sent was kept: %v", err)
	}
	statsWhen(t, rw, "two retries, then the dead letter", func(s map[string]int64) bool { return s["dead_letter"] == 1 })
	if s := rw.w.Stats().Snapshot(); s["retry"] != 2 || s["dead_letter"] != 1 {
		t.Fatalf("stats %v", s)
	}
	e.settled()
}

// TestDefiniteFailureIsTheResult: the downstream declines; the failure is
// recorded and answers duplicates.
func TestDefiniteFailureIsTheResult(t *testing.T) {
	t.Parallel()
	o := options{faults: sandbox.Faults{ErrorRate: 1}}
	e := setup(t, o)
	e.startWorker(o, nil)
	j := job(conv(t), 0, "send_payment", payment("declined"))
	p := e.publish(j)
	r := e.await(j)
	if r.Status != jobs.StatusError || r.Error.Code != "http_402" {
		t.Fatalf("result %+v", r)
	}
	e.sandbox.SetFaults(sandbox.Faults{})
	dup := job(conv(t), 0, "send_payment", payment("declined"))
	e.publish(dup)
	if r := e.await(dup); r.Status != jobs.StatusError || !r.Duplicate {
		t.Fatalf("duplicate of a failure: %+v", r)
	}
	if row := e.row(p.Key); row.State != ledger.Failed || row.Error.Code != "http_402" {
		t.Fatalf("row %+v", row)
	}
	if len(e.sandbox.Payments()) != 0 {
		t.Fatal("payments made")
	}
	e.settled()
}

// TestAmbiguousKeyedWriteRetriesWithTheSameKey: the downstream applies the
// payment and drops the connection; the retry carries the same key and gets
// the first answer back: one payment.
func TestAmbiguousKeyedWriteRetriesWithTheSameKey(t *testing.T) {
	t.Parallel()
	o := options{faults: sandbox.Faults{DropAfterEffectRate: 1}}
	e := setup(t, o)
	rw := e.startWorker(o, nil)
	j := job(conv(t), 0, "send_payment", payment("dropped"))
	p := e.publish(j)
	r := e.await(j)
	if r.Status != jobs.StatusOK || r.Attempts != 2 {
		t.Fatalf("result %+v", r)
	}
	if n := len(e.sandbox.Payments()); n != 1 {
		t.Fatalf("%d payments", n)
	}
	if row := e.row(p.Key); row.State != ledger.Completed || row.Attempt != 2 {
		t.Fatalf("row %+v", row)
	}
	e.settled()
	statsWhen(t, rw, "the job was not nak'ed once, then acked", func(s map[string]int64) bool { return s["ok"] == 1 })
	if s := rw.w.Stats().Snapshot(); s["retry"] != 1 || s["ok"] != 1 {
		t.Fatalf("the job was not nak'ed once, then acked: %v", s)
	}
}

// TestAmbiguousUnkeyedWriteIsIndeterminate: a ticket is created and the
// connection dropped: toolq cannot know, marks it indeterminate and never
// creates it again.
func TestAmbiguousUnkeyedWriteIsIndeterminate(t *testing.T) {
	t.Parallel()
	o := options{faults: sandbox.Faults{DropAfterEffectRate: 1}}
	e := setup(t, o)
	e.startWorker(o, nil)
	j := job(conv(t), 0, "create_ticket", `{"title":"t","body":"b"}`)
	p := e.publish(j)
	r := e.await(j)
	if r.Status != jobs.StatusIndeterminate {
		t.Fatalf("result %+v", r)
	}
	e.settled()
	if n := len(e.sandbox.Tickets()); n != 1 {
		t.Fatalf("%d tickets", n)
	}
	if row := e.row(p.Key); row.State != ledger.Indeterminate || row.Error.Code != "connection_lost" {
		t.Fatalf("row %+v", row)
	}
	if !strings.Contains(e.logs.String(), "left indeterminate") {
		t.Fatal("not logged")
	}
}

// TestZombieWritesNothing: while the tool runs, the claim is taken over (as
// after a long pause of this worker). The old holder's completion is refused
// and it publishes nothing; the job is answered with the new holder's outcome.
func TestZombieWritesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	e.startWorker(options{}, nil)
	j := job(conv(t), 0, "gated_write", `{"n":1}`)
	p := e.publish(j)
	var row ledger.Row
	testenv.Eventually(t, 10*time.Second, "the call in flight", func() bool {
		r, err := e.store.Get(context.Background(), p.Key)
		row = r
		return err == nil && r.State == ledger.InFlight
	})
	// While the call is held, another attempt ends the lease, takes over and
	// completes: what a long pause of this worker would look like.
	ctx := context.Background()
	if err := e.store.EndLease(ctx, row.Fence(), ledger.ErrorInfo{Code: "test"}); err != nil {
		t.Fatal(err)
	}
	taken, err := e.store.Takeover(ctx, row.Fence(), "usurper", "usurper-token", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.Complete(ctx, taken.Fence(), json.RawMessage(`{"winner":"usurper"}`)); err != nil {
		t.Fatal(err)
	}
	close(e.gate) // the held call returns; its completion is fenced out
	r := e.await(j)
	if string(r.Output) != `{"winner":"usurper"}` || r.Attempts != 2 {
		t.Fatalf("result %+v", r)
	}
	e.settled()
	if rs := e.results(conv(t)); len(rs) != 1 {
		t.Fatalf("%d results published: the zombie published", len(rs))
	}
	if !strings.Contains(e.logs.String(), "lost the claim while the tool ran") {
		t.Fatal("the fenced write was not logged")
	}
}

// TestIdenticalCallsInOneTurnBothRun: two jobs that differ only by ordinal
// both run, and the repeat is logged with both tool_use_ids.
func TestIdenticalCallsInOneTurnBothRun(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	e.startWorker(options{}, nil)
	a := job(conv(t), 2, "send_payment", payment("twice"))
	b := job(conv(t), 2, "send_payment", payment("twice"))
	b.Ordinal = 1
	e.publish(a)
	e.await(a)
	e.publish(b)
	r := e.await(b)
	if r.Status != jobs.StatusOK || r.Duplicate || len(e.sandbox.Payments()) != 2 {
		t.Fatalf("second identical call: %+v, %d payments", r, len(e.sandbox.Payments()))
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "identical call repeated in one turn") || !strings.Contains(logs, a.ToolUseID) || !strings.Contains(logs, b.ToolUseID) {
		t.Fatalf("no warning naming both calls:\n%s", logs)
	}
}

// TestRunTurn: the agent's turn helper publishes a turn's calls and returns
// their results in order, ignoring results of an abandoned attempt.
func TestRunTurn(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	e.startWorker(options{}, nil)
	// The abandoned attempt of the turn: its call ran, its stream was cut.
	abandoned := job(conv(t), 4, "send_payment", payment("turn"))
	e.publish(abandoned)
	e.await(abandoned)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := e.client.RunTurn(ctx, conv(t), 4, []jobs.ToolCall{
		{ToolUseID: "toolu_retry_1", Tool: "send_payment", Args: json.RawMessage(payment("turn"))},
		{ToolUseID: "toolu_retry_2", Tool: "search_orders", Args: json.RawMessage(`{"query":"turn"}`)},
		{ToolUseID: "toolu_retry_3", Tool: "nope", Args: json.RawMessage(`{}`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].ToolUseID != "toolu_retry_1" || got[1].ToolUseID != "toolu_retry_2" || got[2].ToolUseID != "toolu_retry_3" {
		t.Fatalf("entries %+v", got)
	}
	if got[0].IsError || !got[0].Result.Duplicate || got[1].IsError || !got[2].IsError {
		t.Fatalf("entries %+v", got)
	}
	if len(e.sandbox.Payments()) != 1 {
		t.Fatal("the retried turn paid again")
	}
}

var _ = worker.AfterClaim

// TestKeyedWriteWithoutLedger: with the ledger turned off, every delivery
// reaches the downstream, which collapses it by the forwarded key.
func TestKeyedWriteWithoutLedger(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	e.startWorker(options{}, nil)
	var outputs []string
	for range 2 {
		j := job(conv(t), 0, "send_payment_unledgered", payment("no_ledger"))
		p := e.publish(j)
		r := e.await(j)
		if r.Status != jobs.StatusOK {
			t.Fatalf("result %+v", r)
		}
		outputs = append(outputs, string(r.Output))
		if _, err := e.store.Get(context.Background(), p.Key); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("a ledger row for a tool without ledger: %v", err)
		}
	}
	if n := len(e.sandbox.Payments()); n != 1 || outputs[0] != outputs[1] {
		t.Fatalf("%d payments, outputs %q", n, outputs)
	}
}

// TestDurablesSplitTools: two sets of workers, each with its own durable
// filtered to its tools, never see each other's jobs.
func TestDurablesSplitTools(t *testing.T) {
	t.Parallel()
	pay := options{durable: "payments", filter: jobs.JobSubject("send_payment")}
	tickets := options{durable: "tickets", filter: jobs.JobSubject("create_ticket")}
	e := setup(t, pay)
	a := e.startWorker(pay, nil)
	b := e.startWorker(tickets, nil)
	p := job(conv(t), 0, "send_payment", payment("split"))
	tk := job(conv(t), 0, "create_ticket", `{"title":"split","body":"b"}`)
	e.publish(p)
	e.publish(tk)
	if r := e.await(p); r.Status != jobs.StatusOK {
		t.Fatalf("payment %+v", r)
	}
	if r := e.await(tk); r.Status != jobs.StatusOK {
		t.Fatalf("ticket %+v", r)
	}
	statsWhen(t, a, "payments", func(s map[string]int64) bool { return s["ok"] == 1 })
	statsWhen(t, b, "tickets", func(s map[string]int64) bool { return s["ok"] == 1 })
	if sa, sb := a.w.Stats().Snapshot(), b.w.Stats().Snapshot(); sa["ok"] != 1 || sb["ok"] != 1 || sa["rejected"]+sb["rejected"] != 0 {
		t.Fatalf("stats: payments %v, tickets %v", sa, sb)
	}
}
