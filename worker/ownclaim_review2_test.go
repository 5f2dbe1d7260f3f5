package worker_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// sharedEnv is one broker and one SQLite ledger for several workers.
func sharedEnv(t *testing.T) (jetstream.JetStream, *ledger.Store) {
	t.Helper()
	js, err := jetstream.New(testenv.StartNATS(t).Connect())
	if err != nil {
		t.Fatal(err)
	}
	return js, sqliteStore(t)
}

// sqliteStore is a migrated SQLite ledger in the test's temporary
// directory, closed when the test ends.
func sqliteStore(t *testing.T) *ledger.Store {
	t.Helper()
	ctx := context.Background()
	store, err := ledger.OpenSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return store
}

// runWorker starts a worker on js and store; stop ends it (its error is
// not checked: the tests here stop workers that "died").
func runWorker(t *testing.T, js jetstream.JetStream, store *ledger.Store, reg *tools.Registry, cfg worker.Config) (stop func()) {
	t.Helper()
	cfg.JS, cfg.Ledger, cfg.Tools = js, store, reg
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := worker.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

// TestReview2OwnClaimRerunsAnUnkeyedWriteOfADeadProcessWithTheSameOwner
// proves: ownClaim takes any in-flight row with this Owner and this
// tool_use_id for the delivery's own lost claim when tracing is off (the
// default: OpenTelemetry's no-op provider gives no valid span, so the span
// check is skipped) and Worker.held of THIS process is empty. A worker that
// died mid-call and came back with the same Owner string (the default
// host:pid is host:1 in every container restart of a pod; a configured
// --owner is the same by construction) meets the redelivery; its claim
// errors transiently (the answer lost, or the statement never ran), the
// retry reads the dead process's row, and the unkeyed write RUNS AGAIN,
// under the dead attempt's fence, without a takeover. Expected: the effect
// once; the job answered indeterminate (holder_lost) once the lease ends.
func TestReview2OwnClaimRerunsAnUnkeyedWriteOfADeadProcessWithTheSameOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var effects atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		effects.Add(1) // an unkeyed write: each call is one more ticket
		return json.RawMessage(`{"ticket":1}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "ticket", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 300 * time.Millisecond, Lease: 2 * time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := sharedEnv(t)
	consumer := worker.Consumer{AckWait: 500 * time.Millisecond}

	// The first process runs the call and dies before recording it.
	died := make(chan struct{})
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	stop1 := runWorker(t, js, store, reg, worker.Config{Owner: "pod-0", Consumer: consumer, ShutdownTimeout: 50 * time.Millisecond,
		Test: worker.TestConfig{Hook: func(p worker.FaultPoint, j *jobs.Job) {
			if p == worker.DuringTool {
				close(died)
				<-hang // never records the outcome: the process is gone
			}
		}}})
	client := jobs.NewClient(js)
	if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "ticket", ToolUseID: "toolu_1", Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-died:
	case <-time.After(10 * time.Second):
		t.Fatal("the first process never ran the call")
	}
	stop1()

	// The same pod restarts; its first claim meets a ledger blip.
	var lost atomic.Bool
	stop2 := runWorker(t, js, store, reg, worker.Config{Owner: "pod-0", Consumer: consumer,
		Test: worker.TestConfig{LoseClaimAnswer: func() bool { return lost.CompareAndSwap(false, true) }}})
	defer stop2()
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	r, err := client.Await(actx, "c", "toolu_1")
	if err != nil || effects.Load() != 1 || r.Status != jobs.StatusIndeterminate {
		t.Fatalf("an unkeyed write whose holder died: %d effect(s), result %+v, await error %v (claim answer lost: %v)", effects.Load(), r, err, lost.Load())
	}
}
