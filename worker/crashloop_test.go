package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestDuplicateOfALongRunningAttemptIsAnsweredNotDeadLettered: the retried turn's duplicate of a call whose first attempt is still running (heartbeating) waits for it and gets the stored result, however long it runs; it is not taken for a crash loop.
//
// Before the fix: the
// retried turn's duplicate of a call whose first attempt is still running
// (healthy: heartbeating, lease renewed) is dead-lettered max_deliver.
// awaitOther hands it back "uncounted", but every hand-back raises
// JetStream's NumDelivered, and decode's crash guard (3 × MaxDeliver raw
// deliveries) dead-letters it on arrival. docs/design.md: "the job goes back
// as an uncounted retry … as often as needed". With the defaults (5 s wait,
// 1 s backoff doubling to 1 min, MaxDeliver 10) any call running longer than
// about 27 minutes loses its duplicate this way; here the knobs are small.
// The duplicate's tool_use_id then never gets the stored result.
func TestDuplicateOfALongRunningAttemptIsAnsweredNotDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	gate := make(chan struct{})
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		<-gate
		return json.RawMessage(`{"paid":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 20 * time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := startWorker(t, reg, worker.Config{RetryDelay: 10 * time.Millisecond, InFlightWait: 20 * time.Millisecond,
		Consumer: worker.Consumer{MaxDeliver: 2}})
	client := jobs.NewClient(js)
	first := &jobs.Job{ConversationID: "c", Tool: "pay", ToolUseID: "toolu_first", Args: json.RawMessage(`{"amount":1}`)}
	p, err := client.Publish(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the first attempt in flight", func() bool {
		r, err := store.Get(ctx, p.Key)
		return err == nil && r.State == ledger.InFlight
	})
	dup := &jobs.Job{ConversationID: "c", Tool: "pay", ToolUseID: "toolu_retry", Args: json.RawMessage(`{"amount":1}`)}
	if _, err := client.Publish(ctx, dup); err != nil {
		t.Fatal(err)
	}
	// Let the first attempt run for a few seconds: well within its lease
	// and timeout, and kept alive by its heartbeat.
	time.Sleep(4 * time.Second)
	close(gate)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := client.Await(actx, "c", "toolu_first"); err != nil {
		t.Fatalf("first: %v", err)
	}
	r, err := client.Await(actx, "c", "toolu_retry")
	if n := dlqCount(t, js); n != 0 || err != nil {
		t.Fatalf("the duplicate of a healthy in-flight call: result %+v, await error %v, %d dead letter(s)", r, err, n)
	}
}
