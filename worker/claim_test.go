package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestClaimWhoseAnswerWasLostIsRecognised: a claim that committed but whose
// answer never arrived (the connection broke after the commit) is retried;
// the retry finds the row this delivery claimed, and runs the call at once,
// instead of taking it for another worker's claim, waiting out the lease and
// leaving an unkeyed write indeterminate without ever running it.
func TestClaimWhoseAnswerWasLostIsRecognised(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var runs atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		runs.Add(1)
		return json.RawMessage(`{"ticket":1}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "ticket", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec,
		Timeout: 5 * time.Second, Lease: 60 * time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Bool
	js, _ := startWorker(t, reg, worker.Config{Test: worker.TestConfig{LoseClaimAnswer: func() bool { return lost.CompareAndSwap(false, true) }}})
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := jobs.NewClient(js).PublishAndAwait(actx, &jobs.Job{ConversationID: "c", Tool: "ticket", ToolUseID: "toolu_1", Args: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatalf("no result within 10s (the lease is 60s): %v", err)
	}
	if r.Status != jobs.StatusOK || r.Duplicate || runs.Load() != 1 || !lost.Load() {
		t.Fatalf("result %+v after %d runs (answer lost: %v)", r, runs.Load(), lost.Load())
	}
}

// TestClaimOutageTwoDeliveriesOfOneJob: two deliveries of one job (the job
// and an operator's replay of it) in one process, whose first claims both
// fail with a ledger outage: on the retry one of them claims the row, and
// the other, which also had a claim go unanswered, must not take that row
// for its own. Only one runs the call; the other is answered from the
// ledger. The soak found two tickets for one unkeyed write this way, when
// a row was recognised by its owner and tool_use_id rather than by the
// claim's own token. Twenty jobs make the race likely.
func TestClaimOutageTwoDeliveriesOfOneJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[string]int{}
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		mu.Lock()
		runs[r.Key]++
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		return json.RawMessage(`{"ticket":1}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "ticket", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec,
		Timeout: 5 * time.Second, Lease: 60 * time.Second, Concurrency: 64}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var outage atomic.Bool
	outage.Store(true)
	js, _ := startWorker(t, reg, worker.Config{Test: worker.TestConfig{FailClaim: outage.Load}})
	const n = 20
	for i := range n {
		j := &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: "ticket", ToolUseID: fmt.Sprintf("toolu_%d", i), Args: json.RawMessage(`{}`), Version: 1, CreatedAt: time.Now().UTC()}
		body, _ := json.Marshal(j)
		for range 2 { // the job, and its replay: the same body, no message id
			msg := nats.NewMsg(jobs.JobSubject("ticket"))
			msg.Data = body
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(300 * time.Millisecond) // every claim has failed at least once
	outage.Store(false)
	cons, err := js.Consumer(ctx, jobs.JobsStream, "toolq")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "every delivery settled", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != n {
		t.Fatalf("%d calls ran, want %d", len(runs), n)
	}
	for key, k := range runs {
		if k != 1 {
			t.Fatalf("the unkeyed write %s ran %d times", key, k)
		}
	}
}
