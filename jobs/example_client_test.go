package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// An agent publishes the tool calls of a completed turn and appends the
// results; the retry of the turn sends the same call with a new tool_use_id
// and gets the first result back, marked duplicate, without a second effect.
func ExampleClient_RunTurn() {
	dir, _ := os.MkdirTemp("", "toolq-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	// A broker, a ledger and a worker with one built-in tool that counts its effects.
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
	var effects atomic.Int32
	pay := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		return json.RawMessage(fmt.Sprintf(`{"payment":"pay_%d"}`, effects.Add(1))), nil
	})
	reg, _ := tools.NewRegistry([]tools.Definition{{Name: "send_payment", Class: tools.KeyedWrite,
		Schema: json.RawMessage(`{"type":"object","required":["amount_cents"]}`), Executor: pay}}, tools.Config{})
	wctx, stop := context.WithCancel(ctx)
	w, _ := worker.New(wctx, worker.Config{JS: js, Ledger: store, Tools: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	done := make(chan error)
	go func() { done <- w.Run(wctx) }()
	defer func() { stop(); <-done }()

	// The agent.
	client := jobs.NewClient(js)
	call := func(id string) []jobs.ToolCall {
		return []jobs.ToolCall{{ToolUseID: id, Tool: "send_payment", Args: json.RawMessage(`{"amount_cents":500}`)}}
	}
	first, _ := client.RunTurn(ctx, "conv-1", 3, call("toolu_first"))
	retry, _ := client.RunTurn(ctx, "conv-1", 3, call("toolu_retry"))
	for _, r := range append(first, retry...) {
		fmt.Println(r.ToolUseID, string(r.Content), "duplicate:", r.Result.Duplicate)
	}
	fmt.Println("effects:", effects.Load())
	// Output:
	// toolu_first {"payment":"pay_1"} duplicate: false
	// toolu_retry {"payment":"pay_1"} duplicate: true
	// effects: 1
}
