package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestMetrics: jobs by outcome, duplicates suppressed, claim and tool
// latency, breaker state, with no key or conversation among the attributes.
func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg, _ := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })}}, tools.Config{})
	reader := sdkmetric.NewManualReader()
	// The consumer's tracer when it exports no traces: the worker builds no span attributes.
	js, _ := startWorker(t, reg, worker.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), TracerProvider: noop.NewTracerProvider()})
	client := jobs.NewClient(js)
	for _, id := range []string{"toolu_a", "toolu_b"} {
		if r, err := client.PublishAndAwait(ctx, &jobs.Job{ConversationID: "c", Tool: "pay", ToolUseID: id, Args: json.RawMessage(`{}`)}); err != nil || r.Status != jobs.StatusOK {
			t.Fatalf("%+v %v", r, err)
		}
	}
	// A delivery is counted once JetStream is answered, just after its
	// result is published: wait for the second one's count.
	var rm metricdata.ResourceMetrics
	testenv.Eventually(t, 10*time.Second, "toolq.duplicates.suppressed counted", func() bool {
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		return sumOf(rm, "toolq.duplicates.suppressed") >= 1 // its series exist from the start, at zero
	})
	seen := map[string]bool{}
	byNewID := int64(0) // the duplicate came by a new tool_use_id (the worker records no spans here: the route is counted all the same)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			seen[m.Name] = true
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					for _, kv := range dp.Attributes.ToSlice() {
						if kv.Key == "toolq.key" || kv.Key == "toolq.conversation_id" {
							t.Errorf("%s has a high-cardinality attribute %s", m.Name, kv.Key)
						}
					}
					if m.Name == "toolq.jobs" {
						outcome, _ := dp.Attributes.Value(attribute.Key("toolq.outcome"))
						if (outcome.AsString() == "ok" || outcome.AsString() == "duplicate") && dp.Value != 1 {
							t.Errorf("toolq.jobs{%s} = %d, want 1", outcome.AsString(), dp.Value)
						}
					}
					if route, _ := dp.Attributes.Value(attribute.Key("toolq.duplicate.route")); m.Name == "toolq.duplicates.suppressed" && route.AsString() == "new_tool_use_id" {
						byNewID = dp.Value
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name == "toolq.tool.duration" && data.DataPoints[0].Count != 1 {
					t.Errorf("the tool ran %d times by the histogram", data.DataPoints[0].Count)
				}
			}
		}
	}
	if byNewID != 1 {
		t.Errorf("duplicates suppressed by the route new_tool_use_id = %d, want 1", byNewID)
	}
	for _, name := range []string{"toolq.jobs", "toolq.duplicates.suppressed", "toolq.claim.duration", "toolq.tool.duration", "toolq.breaker.state"} {
		if !seen[name] {
			t.Errorf("no %s metric", name)
		}
	}
}

// sumOf adds up the data points of the int64 sum name.
func sumOf(rm metricdata.ResourceMetrics, name string) int64 {
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}

func hasMetric(rm metricdata.ResourceMetrics, name string) bool {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return true
			}
		}
	}
	return false
}

// TestEachDeliveryIsCountedOnce: an unkeyed write left indeterminate and a
// job for a tool nobody registered are each counted once, under their one
// outcome; a tool name the registry lacks becomes the label "unknown", so
// a sender cannot grow the label set.
func TestEachDeliveryIsCountedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg, _ := tools.NewRegistry([]tools.Definition{{Name: "ticket", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			return nil, tools.AmbiguousError("reset", "connection reset after the request was sent", 0, nil)
		})}}, tools.Config{})
	reader := sdkmetric.NewManualReader()
	// The consumer's tracer when it exports no traces: the worker builds no span attributes.
	js, _ := startWorker(t, reg, worker.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), TracerProvider: noop.NewTracerProvider()})
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if r, err := client.PublishAndAwait(actx, &jobs.Job{ConversationID: "c", Tool: "ticket", ToolUseID: "toolu_t", Args: json.RawMessage(`{}`)}); err != nil || r.Status != jobs.StatusIndeterminate {
		t.Fatalf("%+v %v", r, err)
	}
	for _, name := range []string{"made_up_1", "made_up_2"} {
		if r, err := client.PublishAndAwait(actx, &jobs.Job{ConversationID: "c", Tool: name, ToolUseID: "toolu_" + name, Args: json.RawMessage(`{}`)}); err != nil || r.Status != jobs.StatusRejected {
			t.Fatalf("%+v %v", r, err)
		}
	}
	counts := map[string]int64{}
	testenv.Eventually(t, 10*time.Second, "three deliveries counted", func() bool {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		clear(counts)
		var total int64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "toolq.jobs" {
					for _, dp := range sum.DataPoints {
						outcome, _ := dp.Attributes.Value(attribute.Key("toolq.outcome"))
						tool, _ := dp.Attributes.Value(attribute.Key("toolq.tool"))
						counts[outcome.AsString()+"/"+tool.AsString()] += dp.Value
						total += dp.Value
					}
				}
			}
		}
		return total >= 3
	})
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "toolq.ledger.indeterminate" {
				if len(sum.DataPoints) != 1 || sum.DataPoints[0].Value != 1 { // the one ledgered tool
					t.Errorf("toolq.ledger.indeterminate %+v, want one row for ticket", sum.DataPoints)
				}
			}
		}
	}
	if !hasMetric(rm, "toolq.ledger.indeterminate") {
		t.Error("no toolq.ledger.indeterminate")
	}
	want := map[string]int64{"indeterminate/ticket": 1, "rejected/unknown": 2}
	if len(counts) != len(want) || counts["indeterminate/ticket"] != 1 || counts["rejected/unknown"] != 2 {
		t.Fatalf("toolq.jobs %v, want %v", counts, want)
	}
}

// TestTakeoversAreCounted: a holder that stopped mid-call leaves an
// in-flight row whose lease runs out. The next delivery takes it over (a
// keyed write runs again with its key, an unkeyed write becomes
// indeterminate), and toolq.ledger.takeovers counts each, by tool: the
// series the "leases expiring" alert watches.
func TestTakeoversAreCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ok := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"id":"p1"}`), nil
	})
	schema := json.RawMessage(`{"type":"object"}`)
	reg, _ := tools.NewRegistry([]tools.Definition{
		{Name: "pay", Class: tools.KeyedWrite, Schema: schema, Executor: ok},
		{Name: "ticket", Class: tools.UnkeyedWrite, Schema: schema, Executor: ok},
		{Name: "idle", Class: tools.KeyedWrite, Schema: schema, Executor: ok},
	}, tools.Config{})
	reader := sdkmetric.NewManualReader()
	js, store := startWorker(t, reg, worker.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	client := jobs.NewClient(js)
	want := map[string]jobs.Status{"pay": jobs.StatusOK, "ticket": jobs.StatusIndeterminate}
	for tool, status := range want {
		j := &jobs.Job{ConversationID: "c", Tool: tool, ToolUseID: "toolu_" + tool, Args: json.RawMessage(`{"n":1}`)}
		m, err := j.Call().Material()
		if err != nil {
			t.Fatal(err)
		}
		// The dead holder's claim: its lease has run out by the time the job comes.
		c := ledger.Claim{Key: m.Key(), ConversationID: j.ConversationID, Tool: tool, ArgsDigest: m.ArgsDigest(), ToolUseID: "toolu_dead",
			Owner: "dead-host:1", Lease: time.Millisecond, Token: "dead"}
		if res, err := store.Claim(ctx, []ledger.Claim{c}); err != nil || !res[0].Claimed {
			t.Fatalf("the dead holder's claim: %+v %v", res, err)
		}
		time.Sleep(20 * time.Millisecond)
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		r, err := client.PublishAndAwait(actx, j)
		cancel()
		if err != nil || r.Status != status {
			t.Fatalf("%s: %+v %v, want %s", tool, r, err, status)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "toolq.ledger.takeovers" {
				for _, dp := range sum.DataPoints {
					tool, _ := dp.Attributes.Value(attribute.Key("toolq.tool"))
					got[tool.AsString()] += dp.Value
				}
			}
		}
	}
	if len(got) != 3 || got["pay"] != 1 || got["ticket"] != 1 || got["idle"] != 0 {
		t.Fatalf("toolq.ledger.takeovers %v, want pay 1, ticket 1, idle 0 (its series exists at zero)", got)
	}
}
