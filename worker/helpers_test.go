package worker_test

// Helpers shared by the worker's tests.

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// startWorker starts an in-process JetStream server, a SQLite ledger and a
// worker with cfg (JS, Ledger and Tools filled in) for the test, and stops
// them when it ends.
func startWorker(t *testing.T, reg *tools.Registry, cfg worker.Config) (jetstream.JetStream, *ledger.Store) {
	t.Helper()
	dir := t.TempDir()
	srv, err := server.NewServer(&server.Options{Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	store, err := ledger.OpenSQLite(ctx, filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	store.SetAnsweredEvery(100 * time.Millisecond) // the tests' retentions are seconds
	cfg.JS, cfg.Ledger, cfg.Tools = js, store, reg
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	wctx, stop := context.WithCancel(ctx)
	w, err := worker.New(wctx, cfg)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	return js, store
}

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

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// dlqCount is how many dead letters TOOLQ_DLQ holds.
func dlqCount(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), jobs.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		if m, err := s.GetMsg(context.Background(), seq); err == nil {
			t.Logf("dead letter %d: %s, %s", seq, m.Subject, m.Header.Get(jobs.HeaderDLQDetail))
		}
	}
	return info.State.Msgs
}

// deadLetters returns the messages of TOOLQ_DLQ.
func deadLetters(t *testing.T, js jetstream.JetStream) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		if m, err := s.GetMsg(ctx, seq); err == nil {
			out = append(out, m)
		}
	}
	return out
}
