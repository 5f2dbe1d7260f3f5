package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// An agent reads its tool list from the consumers' registry, in the shape
// of the model API it calls, and hands it to the model as it is.
func ExampleClient_Tools() {
	srv, _ := server.NewServer(&server.Options{Port: -1, NoLog: true, NoSigs: true})
	go srv.Start()
	srv.ReadyForConnections(10 * time.Second)
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()

	// The consumer's side: its registry, served on toolq.tools.list.
	reg, _ := tools.NewRegistry([]tools.Definition{{Name: "send_payment", Description: "Pay an invoice.", Class: tools.KeyedWrite,
		Schema:   json.RawMessage(`{"type":"object","properties":{"amount_cents":{"type":"integer"}},"required":["amount_cents"]}`),
		Executor: tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return nil, nil })}}, tools.Config{})
	svc, _ := worker.ServeTools(nc, reg, nil)
	defer svc.Stop()

	// The agent's side.
	js, _ := jetstream.New(nc)
	defs, err := jobs.NewClient(js).Tools(context.Background(), "anthropic")
	fmt.Println(string(defs), err)
	// Output:
	// [{"name":"send_payment","description":"Pay an invoice.","input_schema":{"type":"object","properties":{"amount_cents":{"type":"integer"}},"required":["amount_cents"]}}] <nil>
}
