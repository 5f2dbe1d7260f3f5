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

// TestRunTurnAgainJustAfterTheJobsWindowGetsItsAnswer: the jobs stream's
// duplicate window starts when the job was published, the results
// stream's when its result was, later by the call's duration. A RunTurn of
// the same turn in between is taken as a new job and answered from the
// ledger; that answer must reach it, under its own message id (it was
// dropped as the first result's duplicate, and RunTurn waited for ever).
func TestRunTurnAgainJustAfterTheJobsWindowGetsItsAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var runs atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		runs.Add(1)
		time.Sleep(1500 * time.Millisecond) // the call takes a while
		return json.RawMessage(`{"paid":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 5 * time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const window = 2 * time.Second
	js, _ := startWorker(t, reg, worker.Config{Streams: jobs.Streams{DuplicateWindow: window}})
	client := jobs.NewClient(js)
	calls := []jobs.ToolCall{{ToolUseID: "toolu_1", Tool: "pay", Args: json.RawMessage(`{"amount":5}`)}}

	start := time.Now()
	ctx1, cancel1 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel1()
	first, err := client.RunTurn(ctx1, "c", 1, calls)
	if err != nil || len(first) != 1 || first[0].IsError {
		t.Fatalf("first RunTurn: %+v %v", first, err)
	}
	resultAt := time.Since(start)
	// After the job's window, inside the first result's.
	time.Sleep(window + 500*time.Millisecond - resultAt)
	t.Logf("first result after %v; RunTurn again after %v", resultAt, time.Since(start))

	ctx2, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	again, err := client.RunTurn(ctx2, "c", 1, calls)
	if err != nil || len(again) != 1 {
		t.Fatalf("RunTurn of the same turn again (the agent restarted): %+v, %v (the call ran %d time(s); its answer exists)", again, err, runs.Load())
	}
}
