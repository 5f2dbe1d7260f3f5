package worker_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestWaitingInTheFetchLoopCostsNoDelivery: a job fetched while every slot is busy waits without spending deliveries, and is answered, never dead-lettered.
//
// Before the fix: a job that is fetched
// while every slot is busy waits in the fetch loop (and the pull buffer)
// with no InProgress, so JetStream redelivers it every AckWait while it
// waits, and each redelivery raises NumDelivered. A job that did nothing but
// wait behind a healthy long call ends up in TOOLQ_DLQ as max_deliver
// ("delivered N times … a job that keeps stopping its worker") even though it
// never failed (and, here, was answered too: the first copy runs, the
// later copies trip the crash guard on arrival). Expected: waiting for a
// slot costs no delivery, and no dead letter.
func TestWaitingInTheFetchLoopCostsNoDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	gate := make(chan struct{})
	var fastRuns atomic.Int32
	slow := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		<-gate
		return json.RawMessage(`{"ok":true}`), nil
	})
	fast := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		fastRuns.Add(1)
		return json.RawMessage(`{"ok":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{
		{Name: "slow", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: slow, Timeout: 20 * time.Second},
		{Name: "fast", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: fast, Timeout: time.Second},
	}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := startWorker(t, reg, worker.Config{MaxInFlight: 1, BatchSize: 16, RetryDelay: 10 * time.Millisecond,
		Consumer: worker.Consumer{MaxDeliver: 2, AckWait: 300 * time.Millisecond}, Logger: testLogger(t)})
	client := jobs.NewClient(js)
	p, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "slow", ToolUseID: "toolu_slow", Args: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the slow call in flight", func() bool {
		_, err := store.Get(ctx, p.Key)
		return err == nil
	})
	if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "fast", ToolUseID: "toolu_fast", Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the slow call is healthy: heartbeats every 100 ms
	close(gate)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, errFast := client.Await(actx, "c", "toolu_fast")
	time.Sleep(time.Second) // let the redelivered copies settle
	if n := dlqCount(t, js); n != 0 || errFast != nil {
		t.Fatalf("a job that only waited for a slot: await error %v, fast ran %d time(s), %d dead letter(s)", errFast, fastRuns.Load(), n)
	}
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
