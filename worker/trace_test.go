package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/tracing"
	"github.com/toolq/toolq/worker"
)

// TestTracing: the trace goes from the agent's span through the publisher's
// send span to the worker's process span and its children; the ledger row
// keeps the claiming span; a duplicate's process span links to it.
func TestTracing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg, _ := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			if !trace.SpanContextFromContext(ctx).IsValid() {
				return nil, tools.DefiniteError("no_trace", "the executor got no span")
			}
			return json.RawMessage(`{"paid":true}`), nil
		})}}, tools.Config{})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prop := tracing.Propagator()
	js, store := startWorker(t, reg, worker.Config{TracerProvider: tp, Propagator: prop})

	client := jobs.NewClient(js, jobs.WithTracerProvider(tp), jobs.WithPropagator(prop))
	agentCtx, agentSpan := tp.Tracer("agent").Start(ctx, "agent turn")
	first := &jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_first", Args: json.RawMessage(`{"n":1}`)}
	r1, err := client.PublishAndAwait(agentCtx, first)
	if err != nil || r1.Status != jobs.StatusOK {
		t.Fatalf("first: %+v %v", r1, err)
	}
	agentSpan.End()
	retry := &jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_retry", Args: json.RawMessage(`{"n":1}`)}
	r2, err := client.PublishAndAwait(ctx, retry) // another trace: the retried turn
	if err != nil || !r2.Duplicate {
		t.Fatalf("retry: %+v %v", r2, err)
	}

	var spans map[string][]sdktrace.ReadOnlySpan
	testenv.Eventually(t, 10*time.Second, "both process spans ended", func() bool {
		spans = map[string][]sdktrace.ReadOnlySpan{}
		for _, s := range rec.Ended() {
			spans[s.Name()] = append(spans[s.Name()], s)
		}
		return len(spans["process toolq.jobs.pay"]) == 2
	})
	sends, processes := spans["send toolq.jobs.pay"], spans["process toolq.jobs.pay"]
	if len(sends) != 2 || len(processes) != 2 {
		t.Fatalf("spans: %v", names(rec.Ended()))
	}
	var original, duplicate sdktrace.ReadOnlySpan
	for _, p := range processes {
		if attr(p, tracing.KeyToolUseID) == "toolu_first" {
			original = p
		} else {
			duplicate = p
		}
	}
	// agent → send → process, one trace.
	if sends[0].Parent().SpanID() != agentSpan.SpanContext().SpanID() || original.Parent().SpanID() != sends[0].SpanContext().SpanID() ||
		original.SpanContext().TraceID() != agentSpan.SpanContext().TraceID() || original.SpanKind() != trace.SpanKindConsumer {
		t.Fatalf("the process span is not the child of the send span of the agent's trace")
	}
	if attr(original, tracing.KeyLedgerOutcome) != "claimed" || attr(original, tracing.MessagingSystem) != "nats" ||
		attr(original, tracing.KeyKey) != r1.Key || attr(original, tracing.KeyToolClass) != "keyed_write" {
		t.Fatalf("process span attributes %v", original.Attributes())
	}
	for _, name := range []string{"toolq.claim", "execute_tool pay", "toolq.settle", "publish toolq.results"} {
		found := false
		for _, s := range spans[name] {
			found = found || s.Parent().SpanID() == original.SpanContext().SpanID()
		}
		if !found {
			t.Errorf("no %q span under the original process span", name)
		}
	}
	// The ledger row keeps the claiming span…
	row, err := store.Get(ctx, r1.Key)
	if err != nil || row.TraceID != original.SpanContext().TraceID().String() || row.SpanID != original.SpanContext().SpanID().String() {
		t.Fatalf("row %+v", row)
	}
	// …and the duplicate, in its own trace, links to it.
	if attr(duplicate, tracing.KeyLedgerOutcome) != "duplicate" || duplicate.SpanContext().TraceID() == original.SpanContext().TraceID() {
		t.Fatalf("duplicate span %v", duplicate.Attributes())
	}
	links := duplicate.Links()
	if len(links) != 1 || links[0].SpanContext.SpanID() != original.SpanContext().SpanID() || links[0].SpanContext.TraceID() != original.SpanContext().TraceID() {
		t.Fatalf("duplicate links %+v", links)
	}
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value.String()
		}
	}
	return ""
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

// TestSamplerSeesTheStartAttributes: a sampler decides on what a span is
// started with (the OpenTelemetry conventions name messaging.system,
// messaging.operation.type, db.operation.name and gen_ai.operation.name as
// sampling relevant, to be given at creation). A TracerProvider a user hands
// the worker may keep only the calls of one tool, or only the settle spans:
// the process and child spans must carry those attributes when they start.
func TestSamplerSeesTheStartAttributes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg, _ := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) {
			return json.RawMessage(`{"paid":true}`), nil
		})}}, tools.Config{})
	rec := tracetest.NewSpanRecorder()
	keep := attrSampler{tracing.KeyTool.String("pay"), tracing.DBOperation.String("settle")}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(keep))
	js, _ := startWorker(t, reg, worker.Config{TracerProvider: tp, Propagator: tracing.Propagator()})
	client := jobs.NewClient(js) // no trace context: the process span is a root, sampled on its own attributes
	r, err := client.PublishAndAwait(ctx, &jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_1", Args: json.RawMessage(`{"n":1}`)})
	if err != nil || r.Status != jobs.StatusOK {
		t.Fatalf("result %+v %v", r, err)
	}
	testenv.Eventually(t, 10*time.Second, "the sampled spans ended", func() bool {
		got := map[string]bool{}
		for _, s := range rec.Ended() {
			got[s.Name()] = true
		}
		return got["process toolq.jobs.pay"] && got["toolq.settle"]
	})
}

// attrSampler samples a span started with any of its attributes, and drops
// the others.
type attrSampler []attribute.KeyValue

func (a attrSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	for _, kv := range p.Attributes {
		for _, want := range a {
			if kv == want {
				return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
			}
		}
	}
	return sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
}

func (a attrSampler) Description() string { return "attrSampler" }
