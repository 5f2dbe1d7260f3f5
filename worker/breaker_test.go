package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestOpenBreakerDoesNotSpendDeliveries: jobs queued behind a downstream
// whose circuit breaker opened (after another call failed) wait out the open
// period, and its half-open trial, without spending their deliveries: with
// a delivery limit of 2 none is dead-lettered, and every one is answered
// once the downstream is back.
func TestOpenBreakerDoesNotSpendDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		if calls.Add(1) == 1 {
			return nil, tools.NotSentError("connection_refused", "the downstream is down", 0, nil)
		}
		time.Sleep(150 * time.Millisecond) // a slow trial: others find the breaker half-open with its trial taken
		return json.RawMessage(`{"paid":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec,
		Concurrency: 32, Breaker: tools.Breaker{Failures: 1, OpenFor: 300 * time.Millisecond, HalfOpen: 1}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{Consumer: worker.Consumer{MaxDeliver: 2}, RetryDelay: 50 * time.Millisecond})
	client := jobs.NewClient(js)
	const n = 20
	for i := range n {
		if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: "pay", ToolUseID: fmt.Sprintf("toolu_%d", i), Args: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for i := range n {
		r, err := client.Await(actx, "c", fmt.Sprintf("toolu_%d", i))
		if err != nil || r.Status != jobs.StatusOK {
			t.Fatalf("job %d: %+v %v", i, r, err)
		}
	}
	stream, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := stream.Info(ctx); info.State.Msgs != 0 {
		t.Fatalf("%d jobs dead-lettered while waiting for the breaker", info.State.Msgs)
	}
}
