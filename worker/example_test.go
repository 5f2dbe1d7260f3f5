package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// Embedding the consumer: a worker on a JetStream connection, a ledger and
// a registry, run until its context ends. With UntilEmpty it returns once
// the jobs waiting for it are settled. Package embedded provides the NATS
// server and the SQLite ledger here.
func ExampleWorker_Run() {
	ctx := context.Background()
	reg, _ := tools.NewRegistry([]tools.Definition{{
		Name: "greet", Class: tools.Read, Schema: json.RawMessage(`{"type":"object","required":["name"]}`),
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			var args struct{ Name string }
			json.Unmarshal(r.Args, &args)
			return json.Marshal(map[string]string{"greeting": "hello " + args.Name})
		}),
	}}, tools.Config{})
	st, err := embedded.Start(ctx, embedded.Config{Tools: reg})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	js := st.JS
	w, err := worker.New(ctx, worker.Config{JS: js, Ledger: st.Store, Tools: reg, UntilEmpty: true,
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
