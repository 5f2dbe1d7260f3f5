package worker_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestSlowUnclaimedToolIsNotRedelivered: a read tool that runs longer than
// the ack wait, and a job that waits longer than the ack wait for a free
// slot, are kept alive with InProgress: JetStream does not deliver them
// again, so each runs once.
func TestSlowUnclaimedToolIsNotRedelivered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[string]int{}
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		mu.Lock()
		runs[r.ToolUseID]++
		mu.Unlock()
		time.Sleep(1500 * time.Millisecond) // longer than the ack wait
		return json.RawMessage(`{"found":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "lookup", Class: tools.Read, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec,
		Timeout: 5 * time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{MaxInFlight: 1, Consumer: worker.Consumer{AckWait: time.Second}})
	client := jobs.NewClient(js)
	for _, id := range []string{"toolu_1", "toolu_2"} {
		if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "lookup", ToolUseID: id, Args: json.RawMessage(`{"q":"` + id + `"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, id := range []string{"toolu_1", "toolu_2"} {
		if r, err := client.Await(actx, "c", id); err != nil || r.Status != jobs.StatusOK {
			t.Fatalf("%s: %+v %v", id, r, err)
		}
	}
	cons, err := js.Consumer(ctx, jobs.JobsStream, "toolq")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the durable to settle", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"toolu_1", "toolu_2"} {
		if runs[id] != 1 {
			t.Fatalf("runs %v: each job must run once", runs)
		}
	}
}
