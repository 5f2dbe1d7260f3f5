package worker_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestWaitsDoNotSpendTheDeliveryLimit: a retried turn that waited through
// many deliveries behind its first attempt, and then met real failures of its
// own, is dead-lettered only once the call has been tried MaxDeliver times:
// the deliveries it spent waiting count for nothing. Here the first two tries
// are refused by the downstream and the third succeeds, with a limit of 3.
func TestWaitsDoNotSpendTheDeliveryLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	gate := make(chan struct{})
	var calls atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		switch calls.Add(1) {
		case 1:
			<-gate // the first try holds the claim while the retried turn waits
			// come back late: the retried turn takes the next try
			return nil, tools.NotSentError("connection_refused", "down", 6*time.Second, nil)
		case 2:
			return nil, tools.NotSentError("connection_refused", "down", 0, nil)
		}
		return json.RawMessage(`{"paid":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 20 * time.Second, Breaker: tools.Breaker{Failures: 100}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := startWorker(t, reg, worker.Config{RetryDelay: 2 * time.Millisecond, InFlightWait: 20 * time.Millisecond,
		Consumer: worker.Consumer{MaxDeliver: 3}})
	client := jobs.NewClient(js)
	first := &jobs.Job{ConversationID: "c", Tool: "pay", ToolUseID: "toolu_first", Args: json.RawMessage(`{"amount":1}`)}
	p, err := client.Publish(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the first try in flight", func() bool {
		r, err := store.Get(ctx, p.Key)
		return err == nil && r.State == ledger.InFlight
	})
	retried := *first
	retried.ToolUseID = "toolu_retry"
	if _, err := client.Publish(ctx, &retried); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, jobs.JobsStream, "toolq")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 40*time.Second, "the retried turn to wait through more deliveries than 3 × the limit", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumRedelivered > 0 && info.Delivered.Consumer > 11
	})
	close(gate)
	actx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	for _, id := range []string{"toolu_first", "toolu_retry"} {
		r, err := client.Await(actx, "c", id)
		if err != nil || r.Status != jobs.StatusOK {
			t.Fatalf("%s: %+v %v (%d dead letters)", id, r, err, dlqCount(t, js))
		}
	}
	if n := dlqCount(t, js); n != 0 || calls.Load() != 3 {
		t.Fatalf("%d dead letters, %d tries", n, calls.Load())
	}
}
