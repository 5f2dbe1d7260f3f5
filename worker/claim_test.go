package worker_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

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
