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
	"github.com/toolq/toolq/operate"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestLaterAnswerSupersedesAnEarlierOneForAReaderFromTheStart: a call
// answered indeterminate, resolved as not run and replayed, completes; the
// results stream then holds both answers. Every reader from the start
// (Client.Await, RunTurn of the same turn) gets the later one: it stopped
// at the first, and told the agent for ever that the outcome was unknown.
func TestLaterAnswerSupersedesAnEarlierOneForAReaderFromTheStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		if calls.Add(1) == 1 {
			return nil, tools.AmbiguousError("reset", "connection reset after the request was sent", 0, nil)
		}
		return json.RawMessage(`{"ticket":"T-1"}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "ticket", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 5 * time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond})
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	job := &jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "ticket", ToolUseID: "toolu_1", Args: json.RawMessage(`{"title":"x"}`)}
	r, err := client.PublishAndAwait(actx, job)
	if err != nil || r.Status != jobs.StatusIndeterminate {
		t.Fatalf("first answer: %+v %v", r, err)
	}
	key, _ := job.Key()
	// The operator checks downstream, finds nothing, resolves it as not run and replays.
	if changed, err := store.Resolve(ctx, key, ledger.Resolution{NotRun: true, By: "op", Reason: "not in the ticket system"}); !changed || err != nil {
		t.Fatalf("resolve: %v %v", changed, err)
	}
	if _, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobSubject("ticket"), FromSeq: 1}, false, operate.WithLedger(store)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		row, err := store.Get(ctx, key)
		if err == nil && row.State == ledger.Completed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replay never completed the call: %+v %v", row, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The second answer reaches the results stream.
	s, err := js.Stream(ctx, jobs.ResultsStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, "the second answer", func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs >= 2
	})
	got, err := client.Await(actx, "c", "toolu_1")
	if err != nil {
		t.Fatal(err)
	}
	// The agent restarts and replays its record: RunTurn of the same turn.
	turn, err := client.RunTurn(actx, "c", 1, []jobs.ToolCall{{ToolUseID: "toolu_1", Tool: "ticket", Args: json.RawMessage(`{"title":"x"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != jobs.StatusOK || turn[0].IsError {
		t.Fatalf("the call completed, yet Await returns %q and RunTurn %s", got.Status, turn[0].Content)
	}
}
