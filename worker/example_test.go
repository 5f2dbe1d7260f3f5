package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// Embedding the consumer: a worker on a JetStream connection, a ledger and
// a registry, run until its context ends. With UntilEmpty it returns once
// the jobs waiting for it are settled.
func ExampleWorker_Run() {
	dir, _ := os.MkdirTemp("", "worker-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	srv, _ := server.NewServer(&server.Options{Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	go srv.Start()
	srv.ReadyForConnections(10 * time.Second)
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	store, _ := ledger.OpenSQLite(ctx, filepath.Join(dir, "ledger.db"))
	defer store.Close()
	store.Migrate(ctx)
	reg, _ := tools.NewRegistry([]tools.Definition{{
		Name: "greet", Class: tools.Read, Schema: json.RawMessage(`{"type":"object","required":["name"]}`),
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			var args struct{ Name string }
			json.Unmarshal(r.Args, &args)
			return json.Marshal(map[string]string{"greeting": "hello " + args.Name})
		}),
	}})
	w, err := worker.New(ctx, worker.Config{JS: js, Ledger: store, Tools: reg, UntilEmpty: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := jobs.NewClient(js)
	client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "greet", ToolUseID: "toolu_1", Args: json.RawMessage(`{"name":"toolq"}`)})
	if err := w.Run(ctx); err != nil {
		fmt.Println(err)
	}
	r, _ := client.Await(ctx, "c", "toolu_1")
	fmt.Println(r.Status, string(r.Output))
	// Output:
	// ok {"greeting":"hello toolq"}
}
