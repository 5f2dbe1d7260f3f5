package worker_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestDrainStartsNothingAfterTheSignal: when the worker is told to stop
// while a tool runs and more jobs wait for a slot, it finishes the running
// call and starts no other: the waiting jobs go back to JetStream and the
// next worker runs them, each once.
func TestDrainStartsNothingAfterTheSignal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, err := jetstream.New(testenv.StartNATS(t).Connect())
	if err != nil {
		t.Fatal(err)
	}
	store := sqliteStore(t)
	started := make(chan string, 10)
	release := make(chan struct{})
	var runs atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		runs.Add(1)
		started <- r.ToolUseID
		<-release
		return json.RawMessage(`{"ok":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec,
		Timeout: 10 * time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := worker.Config{JS: js, Ledger: store, Tools: reg, MaxInFlight: 1, BatchSize: 4, ShutdownTimeout: 10 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	w, err := worker.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	client := jobs.NewClient(js)
	ids := []string{"toolu_1", "toolu_2", "toolu_3"}
	for i, id := range ids {
		if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: "pay", ToolUseID: id, Args: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	first := <-started
	stop() // SIGTERM while the first call runs and the others wait for the one slot
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("drain: %v", err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d tool calls started; after the signal only the running one may finish", n)
	}

	// The next worker takes the two that were handed back, and runs each once.
	w2, err := worker.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	wctx2, stop2 := context.WithCancel(ctx)
	defer stop2()
	go w2.Run(wctx2)
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, id := range ids {
		r, err := client.Await(actx, "c", id)
		if err != nil || r.Status != jobs.StatusOK || r.Duplicate {
			t.Fatalf("%s: %+v %v", id, r, err)
		}
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("%d tool calls for 3 jobs (first was %s)", n, first)
	}
}
