package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestQueuedCallIsNotDeclaredDeadWhileItWaitsForASlot pins that a healthy
// call waiting for its tool's concurrency slot, for longer than the tool's
// timeout and grace and its lease together, keeps its claim: the give-up
// clock of the heartbeat runs only once the call has started. Each call is
// sent once and answered ok: no unkeyed write is left indeterminate before it
// was even sent, no keyed write is taken over, and nothing is dead-lettered.
func TestQueuedCallIsNotDeclaredDeadWhileItWaitsForASlot(t *testing.T) {
	t.Parallel()
	for _, class := range []tools.Class{tools.UnkeyedWrite, tools.KeyedWrite} {
		t.Run(string(class), func(t *testing.T) {
			t.Parallel()
			const calls = 20
			var mu sync.Mutex
			sent := map[string]int{}
			exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
				mu.Lock()
				sent[r.ToolUseID]++
				mu.Unlock()
				time.Sleep(250 * time.Millisecond) // healthy: well inside the timeout
				return json.RawMessage(`{"ok":true}`), nil
			})
			// Give-up after 300 ms + 1 s, lease 1.5 s: the last of twenty
			// calls of 250 ms each, one at a time, waits 4.75 s for its slot.
			// (The lease leaves room for a heartbeat delayed on a loaded
			// machine: a lapse that long is a real one.)
			reg, err := tools.NewRegistry([]tools.Definition{{Name: "queued", Class: class, Schema: json.RawMessage(`{"type":"object"}`),
				Executor: exec, Timeout: 300 * time.Millisecond, Lease: 1500 * time.Millisecond, Concurrency: 1}}, tools.Config{})
			if err != nil {
				t.Fatal(err)
			}
			js, store := startWorker(t, reg, worker.Config{MaxInFlight: calls, RetryDelay: 20 * time.Millisecond,
				Consumer: worker.Consumer{MaxDeliver: 3, AckWait: time.Second}, Logger: testLogger(t)})
			client := jobs.NewClient(js)
			ctx := context.Background()
			keys := map[string]string{}
			for i := range calls {
				id := fmt.Sprintf("toolu_q%02d", i)
				p, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "queued", ToolUseID: id, Args: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
				if err != nil {
					t.Fatal(err)
				}
				keys[id] = p.Key
			}
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			for id, key := range keys {
				res, err := client.Await(actx, "c", id)
				if err != nil {
					t.Fatalf("%s: %v", id, err)
				}
				if res.Status != jobs.StatusOK {
					t.Errorf("%s: a healthy call that waited for its slot was answered %s (%+v)", id, res.Status, res.Error)
				}
				row, err := store.Get(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if row.Attempt != 1 {
					t.Errorf("%s: the row is at attempt %d: its claim was taken over while the call waited for a slot", id, row.Attempt)
				}
			}
			mu.Lock()
			for id := range keys {
				if sent[id] != 1 {
					t.Errorf("%s was sent %d times, want 1", id, sent[id])
				}
			}
			mu.Unlock()
			if n := dlqCount(t, js); n != 0 {
				t.Errorf("%d dead letters for healthy calls", n)
			}
		})
	}
}

// TestCallIsNotSentOnALapsedClaim pins that a delivery whose claim lapsed
// before its call was sent (its process stalled past the lease, and another
// delivery took the call over) never sends it: the downstream sees the call
// once, from the delivery that holds the claim.
func TestCallIsNotSentOnALapsedClaim(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var sent []int64
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		mu.Lock()
		sent = append(sent, r.Attempt)
		mu.Unlock()
		return json.RawMessage(`{"ok":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 200 * time.Millisecond, Lease: time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var key atomic.Value
	var stalled atomic.Bool
	released := make(chan struct{})
	var store *ledger.Store
	hook := func(p worker.FaultPoint, j *jobs.Job) {
		if p != worker.AfterClaim || !stalled.CompareAndSwap(false, true) {
			return
		}
		// The first delivery stalls after its claim, past its lease, until
		// another delivery has taken the call over and settled it.
		defer close(released)
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			if k, ok := key.Load().(string); ok {
				if row, err := store.Get(ctx, k); err == nil && row.Attempt >= 2 && row.State == ledger.Completed {
					return
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Error("no other delivery took the stalled call over")
	}
	js, st := startWorker(t, reg, worker.Config{MaxInFlight: 4, RetryDelay: 20 * time.Millisecond,
		Consumer: worker.Consumer{MaxDeliver: 5, AckWait: 500 * time.Millisecond}, Logger: testLogger(t), Test: worker.TestConfig{Hook: hook}})
	store = st
	client := jobs.NewClient(js)
	p, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "pay", ToolUseID: "toolu_pay", Args: json.RawMessage(`{"amount":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	key.Store(p.Key)
	select {
	case <-released:
	case <-time.After(20 * time.Second):
		t.Fatal("the stalled delivery never resumed")
	}
	// Give the resumed delivery time to send, if it were going to.
	testenv.Eventually(t, 5*time.Second, "the resumed delivery settled", func() bool {
		row, err := store.Get(ctx, p.Key)
		return err == nil && row.State == ledger.Completed
	})
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 1 {
		t.Fatalf("the call was sent %d times (attempts %v): a delivery sent it on a claim it no longer held", len(sent), sent)
	}
}
