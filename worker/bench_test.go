package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
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

// BenchmarkWorker measures jobs per second through the whole pipeline (decode,
// claim, a built-in keyed write that returns at once, complete, publish the
// result, ack) against a bare JetStream consumer that only acks the same
// messages, both on one in-process server. ns/op is per job.
func BenchmarkWorker(b *testing.B) {
	for _, backend := range []string{"bare", "sqlite", "postgres"} {
		b.Run(backend, func(b *testing.B) {
			dir := b.TempDir()
			srv, err := server.NewServer(&server.Options{Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
			if err != nil {
				b.Fatal(err)
			}
			go srv.Start()
			srv.ReadyForConnections(10 * time.Second)
			defer srv.Shutdown()
			nc, _ := nats.Connect(srv.ClientURL())
			defer nc.Close()
			js, _ := jetstream.New(nc)
			ctx := context.Background()
			if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{}); err != nil {
				b.Fatal(err)
			}
			client := jobs.NewClient(js)
			publish := func(n int) {
				for i := range n {
					j := &jobs.Job{ConversationID: "bench", Tool: "noop", ToolUseID: fmt.Sprintf("toolu_%d", i),
						TurnIndex: int64(i), Args: json.RawMessage(`{"n":1}`)}
					if _, err := client.Publish(ctx, j); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			publish(b.N)
			b.StartTimer()
			if backend == "bare" {
				cons, err := js.CreateOrUpdateConsumer(ctx, jobs.JobsStream, jetstream.ConsumerConfig{Durable: "bare", AckPolicy: jetstream.AckExplicitPolicy})
				if err != nil {
					b.Fatal(err)
				}
				it, _ := cons.Messages(jetstream.PullMaxMessages(32))
				for range b.N {
					m, err := it.Next()
					if err != nil {
						b.Fatal(err)
					}
					m.Ack()
				}
				it.Stop()
				return
			}
			var store *ledger.Store
			if backend == "sqlite" {
				store, err = ledger.OpenSQLite(ctx, filepath.Join(dir, "ledger.db"))
			} else {
				store, err = ledger.OpenPostgres(ctx, testenv.Postgres(b))
			}
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			store.Migrate(ctx)
			noop := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
				return json.RawMessage(`{"ok":true}`), nil
			})
			reg, _ := tools.NewRegistry([]tools.Definition{{Name: "noop", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: noop, Concurrency: 256}}, tools.Config{})
			w, err := worker.New(ctx, worker.Config{JS: js, Ledger: store, Tools: reg, UntilEmpty: true, MaxInFlight: 256, BatchSize: 64,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			if err := w.Run(ctx); err != nil {
				b.Fatal(err)
			}
			if got := w.Stats().Snapshot()["ok"]; got != int64(b.N) {
				b.Fatalf("%d jobs settled, want %d", got, b.N)
			}
		})
	}
}
