package worker_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestExecutorPanicIsAmbiguous: a built-in executor that panics does not
// stop the consumer. For an unkeyed write the call's effect is unknown, so
// its row becomes indeterminate and it is never run again; a keyed write is
// retried with the same key; and the next job is processed as usual.
func TestExecutorPanicIsAmbiguous(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var unkeyedRuns, keyedRuns atomic.Int32
	panicky := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		unkeyedRuns.Add(1)
		panic("the ticket system's client broke")
	})
	panicOnce := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		if keyedRuns.Add(1) == 1 {
			panic("first call panics")
		}
		return json.RawMessage(`{"paid":true}`), nil
	})
	ok := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"ok":true}`), nil
	})
	schema := json.RawMessage(`{"type":"object"}`)
	reg, err := tools.NewRegistry([]tools.Definition{
		{Name: "ticket", Class: tools.UnkeyedWrite, Schema: schema, Executor: panicky},
		{Name: "pay", Class: tools.KeyedWrite, Schema: schema, Executor: panicOnce},
		{Name: "lookup", Class: tools.Read, Schema: schema, Executor: ok},
	}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := startWorker(t, reg, worker.Config{RetryDelay: 50 * time.Millisecond})
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	ticket := &jobs.Job{ConversationID: "c", Tool: "ticket", ToolUseID: "toolu_t", Args: json.RawMessage(`{"title":"x"}`)}
	r, err := client.PublishAndAwait(actx, ticket)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != jobs.StatusIndeterminate || r.Error == nil || r.Error.Code != "panic" {
		t.Fatalf("unkeyed write whose executor panicked: %+v %+v", r, r.Error)
	}
	key, _ := ticket.Key()
	if row, err := store.Get(ctx, key); err != nil || row.State != ledger.Indeterminate {
		t.Fatalf("ledger row %+v %v, want indeterminate", row, err)
	}

	r, err = client.PublishAndAwait(actx, &jobs.Job{ConversationID: "c", Tool: "pay", ToolUseID: "toolu_p", Args: json.RawMessage(`{"amount":1}`)})
	if err != nil || r.Status != jobs.StatusOK || string(r.Output) != `{"paid":true}` {
		t.Fatalf("keyed write retried after a panic: %+v %v", r, err)
	}
	if keyedRuns.Load() != 2 {
		t.Fatalf("keyed executor ran %d times, want 2 (the panic, then the retry with the same key)", keyedRuns.Load())
	}

	r, err = client.PublishAndAwait(actx, &jobs.Job{ConversationID: "c", Tool: "lookup", ToolUseID: "toolu_l", Args: json.RawMessage(`{}`)})
	if err != nil || r.Status != jobs.StatusOK {
		t.Fatalf("the consumer stopped working after a panic: %+v %v", r, err)
	}
	if unkeyedRuns.Load() != 1 {
		t.Fatalf("the unkeyed executor ran %d times, want 1", unkeyedRuns.Load())
	}
}
