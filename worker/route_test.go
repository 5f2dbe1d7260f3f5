package worker_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestEachDuplicateRouteHasItsSeries: a call that comes back by each of the
// five routes (a retried turn under a new tool_use_id, a redelivery of the
// same message, an operator's replay, a requeue from the DLQ, a
// republication after the duplicate window) runs once and increments
// toolq.duplicates.suppressed under its own route; each duplicate's span
// says why nothing ran and which tool_use_id ran it. Also counted: the
// dead letter by reason, and in-flight back to zero.
func TestEachDuplicateRouteHasItsSeries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var runs atomic.Int32
	reg, _ := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			runs.Add(1)
			return json.RawMessage(`{"id":"pay_1"}`), nil
		})}}, tools.Config{})
	// The redelivery: the first delivery of toolu_redeliver waits before its
	// ack until JetStream, past the ack wait, has delivered it again and the
	// second delivery is about to ack.
	var (
		redeliverSeen = make(chan struct{})
		once          sync.Once
		firstAck      atomic.Bool
	)
	hook := func(p worker.FaultPoint, j *jobs.Job) {
		if p != worker.BeforeAck || j.ToolUseID != "toolu_redeliver" {
			return
		}
		if firstAck.CompareAndSwap(false, true) {
			select {
			case <-redeliverSeen:
			case <-time.After(20 * time.Second):
			}
			return
		}
		once.Do(func() { close(redeliverSeen) })
	}
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	js, _ := startWorker(t, reg, worker.Config{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
		Consumer:       worker.Consumer{AckWait: time.Second},
		Test:           worker.TestConfig{Hook: hook},
	})
	client := jobs.NewClient(js)
	job := func(id string) *jobs.Job {
		return &jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "pay", ToolUseID: id, Args: json.RawMessage(`{"n":1}`)}
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if r, err := client.PublishAndAwait(actx, job("toolu_first")); err != nil || r.Status != jobs.StatusOK || r.Duplicate {
		t.Fatalf("%+v %v", r, err)
	}
	if r, err := client.PublishAndAwait(actx, job("toolu_retried_turn")); err != nil || !r.Duplicate {
		t.Fatalf("%+v %v", r, err)
	}
	// The same job published again by hand, with a message id the duplicate
	// window has not seen, and with each replay header.
	for i, replayOf := range []string{"", "1", "dlq:7"} {
		j := job("toolu_first")
		j.Version, j.CreatedAt = jobs.Version, time.Now().UTC()
		key, _ := j.Key()
		msg := nats.NewMsg(jobs.JobSubject(j.Tool))
		msg.Data, _ = json.Marshal(j)
		msg.Header.Set(jobs.HeaderKey, key)
		if replayOf != "" {
			msg.Header.Set(jobs.HeaderReplayOf, replayOf)
		}
		if _, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID("again-"+string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	// A different call, later delivered again.
	j := job("toolu_redeliver")
	j.Args = json.RawMessage(`{"n":2}`)
	if _, err := client.Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	// Not a job at all: a dead letter.
	if _, err := js.Publish(ctx, jobs.JobSubject("pay"), []byte("not json")); err != nil {
		t.Fatal(err)
	}

	want := map[string]int64{"new_tool_use_id": 1, "republish": 1, "replay": 1, "requeue": 1, "redelivery": 1}
	var routes map[string]int64
	var deadLetters, inFlight int64
	testenv.Eventually(t, 30*time.Second, "a duplicate on each route, the dead letter, nothing in flight", func() bool {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		routes, deadLetters, inFlight = map[string]int64{}, 0, -1
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				sum, ok := m.Data.(metricdata.Sum[int64])
				if !ok {
					continue
				}
				for _, dp := range sum.DataPoints {
					switch m.Name {
					case "toolq.duplicates.suppressed":
						route, _ := dp.Attributes.Value(attribute.Key("toolq.duplicate.route"))
						routes[route.AsString()] += dp.Value
					case "toolq.dead_letters":
						if reason, _ := dp.Attributes.Value(attribute.Key("toolq.dlq.reason")); reason.AsString() == jobs.DLQInvalid {
							deadLetters += dp.Value
						}
					case "toolq.jobs.in_flight":
						inFlight = dp.Value
					}
				}
			}
		}
		for route, n := range want {
			if routes[route] < n {
				return false
			}
		}
		return deadLetters == 1 && inFlight == 0
	})
	for route, n := range want {
		if routes[route] != n {
			t.Errorf("toolq.duplicates.suppressed{route=%s} = %d, want %d (all: %v)", route, routes[route], n, routes)
		}
	}
	if len(routes) != len(want) {
		t.Errorf("routes %v, want %v", routes, want)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("the tool ran %d times for two calls", n)
	}
	// The retried turn's span explains itself.
	found := false
	for _, s := range spans.Ended() {
		for _, e := range s.Events() {
			if e.Name != "toolq.duplicate" {
				continue
			}
			attrs := map[attribute.Key]string{}
			for _, kv := range e.Attributes {
				attrs[kv.Key] = kv.Value.String()
			}
			if attrs["toolq.duplicate.route"] == "new_tool_use_id" {
				found = true
				if attrs["toolq.original.tool_use_id"] != "toolu_first" || attrs["toolq.duplicate.reason"] != "completed_before" {
					t.Errorf("duplicate event %v", attrs)
				}
				if len(s.Links()) == 0 {
					t.Errorf("the duplicate's span has no link to the original")
				}
			}
		}
	}
	if !found {
		t.Error("no toolq.duplicate event for the retried turn")
	}
}
