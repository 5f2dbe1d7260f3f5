package worker_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestKeyedWriteWithInvalidUTF8OutputRunsOnceAndIsAnswered: a keyed write that succeeds with output that is not valid UTF-8 runs once and is answered (its output repaired), not run again until dead-lettered.
//
// Before the fix: a keyed write whose executor SUCCEEDS with output that json.Valid
// accepts but that is not valid UTF-8 (a byte 0xff inside a string) is never
// answered. tools.Run classifies it Success; Complete refuses it with
// ledger.ErrInvalidOutput; execute treats that as lostClaim's "other write
// error" (a counted retry) and leaves the row in_flight. Every later delivery
// waits out the lease, takes over and RUNS THE TOOL AGAIN, until the
// delivery limit dead-letters a call that took effect on the first try.
// Expected: one run and a result (ok, or a definite/indeterminate error
// saying the output was unusable).
func TestKeyedWriteWithInvalidUTF8OutputRunsOnceAndIsAnswered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var runs atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		runs.Add(1)
		return json.RawMessage("{\"name\":\"caf\xff\"}"), nil // json.Valid: true; utf8.Valid: false
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 100 * time.Millisecond, Lease: 200 * time.Millisecond}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, InFlightWait: 50 * time.Millisecond,
		Consumer: worker.Consumer{MaxDeliver: 3}})
	client := jobs.NewClient(js)
	j := &jobs.Job{ConversationID: "c", Tool: "pay", ToolUseID: "toolu_u", Args: json.RawMessage(`{"amount":1}`)}
	if _, err := client.Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	r, awaitErr := client.Await(actx, "c", "toolu_u")
	key, _ := j.Key()
	row, rowErr := store.Get(ctx, key)
	t.Logf("executor runs=%d, result=%+v (await err %v), dead letters=%d, ledger row state=%s attempt=%d (%v)",
		runs.Load(), r, awaitErr, dlqCount(t, js), row.State, row.Attempt, rowErr)
	if awaitErr != nil {
		t.Errorf("a call that succeeded was never answered: %v (dead letters: %d)", awaitErr, dlqCount(t, js))
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the keyed write ran %d times for one call that succeeded the first time", n)
	}
	if rowErr == nil && row.State == ledger.InFlight {
		t.Errorf("the ledger row is still in_flight at attempt %d after the call succeeded", row.Attempt)
	}
}

// TestUnkeyedWriteWithInvalidUTF8OutputIsAnsweredNotHolderLost: an unkeyed write that succeeds with output that is not valid UTF-8 is answered from what it returned, not reported as a holder that stopped.
//
// Before the fix: an
// unkeyed write that SUCCEEDED with non-UTF-8 output is answered, after the
// lease runs out, as indeterminate "holder_lost: <this worker> stopped during
// attempt 1" although no worker stopped and the executor said yes: the
// ErrInvalidOutput refusal is handled as if the worker had died, and the
// success (and its output) is lost to the agent and the operator.
func TestUnkeyedWriteWithInvalidUTF8OutputIsAnsweredNotHolderLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var runs atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		runs.Add(1)
		return json.RawMessage("{\"ticket\":\"T-1\",\"title\":\"\xc3\"}"), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "ticket", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 100 * time.Millisecond, Lease: 200 * time.Millisecond}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, InFlightWait: 50 * time.Millisecond,
		Consumer: worker.Consumer{MaxDeliver: 5}})
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	r, err := client.PublishAndAwait(actx, &jobs.Job{ConversationID: "c", Tool: "ticket", ToolUseID: "toolu_t", Args: json.RawMessage(`{"t":1}`)})
	if err != nil {
		t.Fatalf("never answered: %v (runs %d, dead letters %d)", err, runs.Load(), dlqCount(t, js))
	}
	t.Logf("runs=%d status=%s error=%+v attempts=%d", runs.Load(), r.Status, r.Error, r.Attempts)
	if r.Status == jobs.StatusIndeterminate && r.Error != nil && r.Error.Code == "holder_lost" {
		t.Errorf("a call that succeeded on attempt 1 is reported %s/%s: %q", r.Status, r.Error.Code, r.Error.Message)
	}
}
