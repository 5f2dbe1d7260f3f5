package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// halfOpenHeld builds a tool of class whose downstream's breaker (Failures
// 1, OpenFor 200ms, HalfOpen 1) is opened by the job "opener" failing
// NotSent once; the opener's next try is the half-open trial, and it blocks
// until gate is closed, keeping the breaker half-open with its trial taken.
// The victim's first executor call (after the breaker closes) is ambiguous,
// every later one succeeds. trial is closed when the trial has begun.
func halfOpenHeld(t *testing.T, class tools.Class, gate chan struct{}) (reg *tools.Registry, trial chan struct{}, victimCalls *atomic.Int32) {
	t.Helper()
	trial = make(chan struct{})
	victimCalls = new(atomic.Int32)
	var openerCalls atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		if strings.Contains(string(r.Args), "opener") {
			if openerCalls.Add(1) == 1 {
				return nil, tools.NotSentError("connection_refused", "down", 10*time.Millisecond, nil)
			}
			close(trial)
			<-gate
			return json.RawMessage(`{"ok":true}`), nil
		}
		if victimCalls.Add(1) == 1 {
			return nil, tools.AmbiguousError("timeout", "the downstream timed out", 10*time.Millisecond, nil)
		}
		return json.RawMessage(`{"ok":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "call", Class: class, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec,
		Timeout: 20 * time.Second, Breaker: tools.Breaker{Failures: 1, OpenFor: 200 * time.Millisecond, HalfOpen: 1}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return reg, trial, victimCalls
}

// TestCallsHeldBackByAHalfOpenBreakerSpendNoTries: a keyed write held back by a half-open breaker (its trial taken) spends none of its tries: once the downstream answers, it is retried and its second try succeeds.
//
// Before the fix: a keyed write
// that arrives while its downstream's breaker is half-open with the trial
// taken is claimed (BreakerWait is 0 when half-open), refused by gobreaker
// (ErrTooManyRequests → NotSent breaker_open), released and handed back
// "uncounted" — but every such claim of the released row raises the row's
// attempt, and outcome.tries IS the attempt. After a few rounds behind the
// trial the call has "used" the whole delivery limit without ever reaching
// its downstream, and its FIRST real failure (one ambiguous try) dead-letters
// it with "still unsettled after N tries". Expected (docs/design.md, The
// delivery limit: "a call held back by an open breaker … costs the call
// none of its tries"): retried, second try succeeds, result ok.
func TestCallsHeldBackByAHalfOpenBreakerSpendNoTries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	gate := make(chan struct{})
	reg, trial, victimCalls := halfOpenHeld(t, tools.KeyedWrite, gate)
	js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, Consumer: worker.Consumer{MaxDeliver: 3}})
	client := jobs.NewClient(js)
	if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "call", ToolUseID: "toolu_opener", Args: json.RawMessage(`{"who":"opener"}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-trial:
	case <-time.After(10 * time.Second):
		t.Fatal("the half-open trial never started")
	}
	if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "call", ToolUseID: "toolu_victim", Args: json.RawMessage(`{"who":"victim"}`)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // ~7 half-open refusals of the victim, none of them a try
	close(gate)
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	r, err := client.Await(actx, "c", "toolu_victim")
	if n := dlqCount(t, js); err != nil || r.Status != jobs.StatusOK || n != 0 {
		t.Fatalf("victim after %d real tries: result %+v, await error %v, %d dead letter(s)", victimCalls.Load(), r, err, n)
	}
}

// TestReadHeldBackByAHalfOpenBreakerIsNotDeadLettered: a read tool (no ledger row) held back by a half-open breaker is handed back uncounted and answered once the breaker closes, never dead-lettered.
//
// Before the fix: a read
// tool (no ledger row) held back by a half-open breaker gets uncounted
// retries, but each one raises JetStream's delivery count, which is what
// both the crash guard (> 3 × MaxDeliver before an unclaimed tool runs) and
// the counted limit of a tool without a row read. The job never crashed
// anything and never reached its downstream, yet it is dead-lettered
// max_deliver while the breaker's trial is still running. Expected: no dead
// letter; answered once the breaker closes.
func TestReadHeldBackByAHalfOpenBreakerIsNotDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	gate := make(chan struct{})
	reg, trial, victimCalls := halfOpenHeld(t, tools.Read, gate)
	js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, Consumer: worker.Consumer{MaxDeliver: 2}})
	client := jobs.NewClient(js)
	if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "call", ToolUseID: "toolu_opener", Args: json.RawMessage(`{"who":"opener"}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-trial:
	case <-time.After(10 * time.Second):
		t.Fatal("the half-open trial never started")
	}
	if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "call", ToolUseID: "toolu_victim", Args: json.RawMessage(`{"who":"victim"}`)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // ~10 half-open refusals
	close(gate)
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	r, err := client.Await(actx, "c", "toolu_victim")
	if n := dlqCount(t, js); err != nil || r.Status != jobs.StatusOK || n != 0 {
		t.Fatalf("read job behind a half-open breaker after %d real tries: result %+v, await error %v, %d dead letter(s)", victimCalls.Load(), r, err, n)
	}
}
