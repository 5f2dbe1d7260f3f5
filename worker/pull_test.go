package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestPullThatEndsIsSetUpAgain: the server ends the worker's pull (here
// the durable consumer is deleted under it). The worker does not stop: it
// provisions the durable again and pulls on, and a job published after
// that is answered; Run returns only at the drain, without error.
func TestPullThatEndsIsSetUpAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(testenv.StartNATS(t).Connect())
	if err != nil {
		t.Fatal(err)
	}
	store := sqliteStore(t)
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"ok":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	w, err := worker.New(ctx, worker.Config{JS: js, Ledger: store, Tools: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	client := jobs.NewClient(js)
	call := func(i int) {
		t.Helper()
		actx, acancel := context.WithTimeout(ctx, 20*time.Second)
		defer acancel()
		r, err := client.PublishAndAwait(actx, &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: "pay", ToolUseID: fmt.Sprintf("toolu_%d", i), Args: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatalf("job %d: %v\n%s", i, err, logs.String())
		}
		if r.Status != jobs.StatusOK {
			t.Fatalf("job %d: %s", i, r.Status)
		}
	}
	call(1)
	durable := worker.Consumer{}.Config().Durable
	for round := range 2 { // twice: the pull set up again also survives
		if err := js.DeleteConsumer(ctx, jobs.JobsStream, durable); err != nil {
			t.Fatal(err)
		}
		call(2 + round)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned before the drain: %v", err)
	default:
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("drain: %v", err)
	}
	if !strings.Contains(logs.String(), "setting it up again") {
		t.Errorf("the restart of the pull was not logged:\n%s", logs.String())
	}
}
