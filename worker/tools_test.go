package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/toolq/toolq/demo"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// serveTools serves reg's tool list on a fresh NATS server and returns a
// client of it.
func serveTools(t *testing.T, reg *tools.Registry) (*jobs.Client, *nats.Conn) {
	t.Helper()
	nc := testenv.StartNATS(t).Connect()
	svc, err := worker.ServeTools(nc, reg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return jobs.NewClient(js), nc
}

// TestToolsAnswersTheRegistryAsTheModelsToolDefinitions: over NATS, an
// agent gets the consumer's registry in each format, exactly as `consumer
// tools export` prints it; an unknown format or a body that is not a
// request is refused with 400.
func TestToolsAnswersTheRegistryAsTheModelsToolDefinitions(t *testing.T) {
	t.Parallel()
	reg, err := demo.Registry("http://127.0.0.1:1", tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	client, nc := serveTools(t, reg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, f := range tools.Formats {
		got, err := client.Tools(ctx, string(f))
		want, _ := reg.Export(f)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: %s %v, want %s", f, got, err, want)
		}
	}
	if _, err := client.Tools(ctx, "gemini"); !errors.Is(err, jobs.ErrToolsRefused) || !strings.Contains(err.Error(), "400") ||
		!strings.Contains(err.Error(), "anthropic, openai, openai-responses, mcp") {
		t.Errorf("unknown format: %v", err)
	}
	msg, err := nc.RequestWithContext(ctx, jobs.ToolsSubject, []byte("anthropic"))
	if err != nil || msg.Header.Get(micro.ErrorCodeHeader) != "400" {
		t.Errorf("a body that is not a request: %v %v", msg, err)
	}
}

// TestToolsRefusesARegistryNoAPITakes: a tool whose schema is for args
// that are not an object is answered with 500 naming the tool, not with a
// list that leaves it out.
func TestToolsRefusesARegistryNoAPITakes(t *testing.T) {
	t.Parallel()
	exec := tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return nil, nil })
	reg, err := tools.NewRegistry([]tools.Definition{
		{Name: "fine", Class: tools.Read, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec},
		{Name: "odd", Class: tools.Read, Schema: json.RawMessage(`{"type":"string"}`), Executor: exec},
	}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	client, _ := serveTools(t, reg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := client.Tools(ctx, "anthropic"); !errors.Is(err, jobs.ErrToolsRefused) || !strings.Contains(err.Error(), `500 tool "odd": schema`) {
		t.Errorf("%s %v", got, err)
	}
}

// TestToolsAnswersAListTooLargeForNATSWithAnError: a registry whose tool
// list exceeds the connection's max payload (1 MiB by default) cannot be
// sent; the agent gets 413 naming the size and the limit, not a timeout.
func TestToolsAnswersAListTooLargeForNATSWithAnError(t *testing.T) {
	t.Parallel()
	var defs []tools.Definition
	exec := tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })
	for i := range 120 {
		defs = append(defs, tools.Definition{Name: fmt.Sprintf("tool_%03d", i), Class: tools.Read, Executor: exec,
			Description: strings.Repeat("A long, imported description. ", 340), // ~10 KB each, ~1.2 MB in all
			Schema:      json.RawMessage(`{"type":"object"}`)})
	}
	reg, err := tools.NewRegistry(defs, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	client, nc := serveTools(t, reg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = client.Tools(ctx, "anthropic")
	if !errors.Is(err, jobs.ErrToolsRefused) || !strings.Contains(err.Error(), "413") ||
		!strings.Contains(err.Error(), fmt.Sprintf("max_payload of %d", nc.MaxPayload())) {
		t.Fatalf("want an error that says the list is too large, got %v", err)
	}
}

// TestToolsWithNoConsumerSaysNoResponders: with no consumer serving the
// list, the request fails at once with NATS's no-responders error.
func TestToolsWithNoConsumerSaysNoResponders(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(testenv.StartNATS(t).Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := jobs.NewClient(js).Tools(ctx, "anthropic"); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("%v, want nats.ErrNoResponders", err)
	}
}
