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

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestRunLeavesNoGoroutines: a worker that processed jobs (with heartbeats,
// a pull iterator and tool goroutines) and was stopped leaves nothing
// running once its broker connection and ledger are closed.
func TestRunLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	srv, err := server.NewServer(&server.Options{Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	store, err := ledger.OpenSQLite(ctx, filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	slow := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		runs.Add(1)
		time.Sleep(150 * time.Millisecond) // long enough for a heartbeat
		return json.RawMessage(`{"ok":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "slow", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: slow, Timeout: 200 * time.Millisecond, Lease: 300 * time.Millisecond}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	w, err := worker.New(wctx, worker.Config{JS: js, Ledger: store, Tools: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- w.Run(wctx) }()
	client := jobs.NewClient(js)
	for _, id := range []string{"toolu_a", "toolu_b", "toolu_c"} {
		if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "slow", ToolUseID: id, Args: json.RawMessage(`{"n":1}`)}); err != nil {
			t.Fatal(err)
		}
	}
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, id := range []string{"toolu_a", "toolu_b", "toolu_c"} {
		if _, err := client.Await(actx, "c", id); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 {
		t.Fatalf("the tool ran %d times for one call", runs.Load())
	}
}

func TestMain(m *testing.M) { testenv.Main(m) }

// TestNewProvisionsIdempotently: workers starting one after another create
// the streams and the durable consumer once and then update them in place.
func TestNewProvisionsIdempotently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, err := jetstream.New(testenv.StartNATS(t).Connect())
	if err != nil {
		t.Fatal(err)
	}
	store, err := ledger.OpenSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	reg, err := tools.NewRegistry(nil, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := worker.New(ctx, worker.Config{JS: js, Ledger: store, Tools: reg, Consumer: worker.Consumer{MaxDeliver: 4}}); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := js.Consumer(ctx, jobs.JobsStream, "toolq")
	if err != nil {
		t.Fatal(err)
	}
	if cfg := cons.CachedInfo().Config; cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.MaxDeliver != -1 || cfg.FilterSubject != jobs.JobsSubjects {
		t.Fatalf("durable consumer %+v: want explicit acks, JetStream's delivery limit off (the worker enforces it), all jobs", cfg)
	}
}
