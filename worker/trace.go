package worker

import (
	"context"
	"encoding/hex"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tracing"
)

const tracerName = "github.com/toolq/toolq/worker"

// startProcess starts the consumer span of one delivery, a child of the
// publisher's send span when the job carries its trace context.
func (w *Worker) startProcess(ctx context.Context, d *delivery) {
	parent := w.propagator.Extract(ctx, jobs.HeaderCarrier(d.msg.Headers()))
	attrs := []attribute.KeyValue{
		tracing.MessagingSystem.String("nats"),
		tracing.MessagingDestination.String(d.msg.Subject()),
		tracing.MessagingOperation.String("process"),
		tracing.MessagingConsumerGroup.String(w.consumer.CachedInfo().Name),
		tracing.MessagingMessageID.String(d.msg.Headers().Get(jobs.HeaderMsgID)),
		tracing.KeyDeliveryCount.Int(d.deliveries),
	}
	if d.job != nil {
		attrs = append(attrs, tracing.KeyKey.String(d.key), tracing.KeyTool.String(d.job.Tool),
			tracing.KeyToolUseID.String(d.job.ToolUseID), tracing.KeyConversation.String(d.job.ConversationID))
	}
	if d.tool != nil {
		attrs = append(attrs, tracing.KeyToolClass.String(string(d.tool.Class)))
	}
	d.ctx, d.span = w.tracer.Start(parent, "process "+d.msg.Subject(), trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// child starts a span under the delivery's process span, on ctx's
// deadlines and cancellation.
func (w *Worker) child(ctx context.Context, d *delivery, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return w.tracer.Start(trace.ContextWithSpan(ctx, d.span), name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// ledgerOutcome records what the claim found on the process span; for a
// row another delivery claimed it links to that delivery's span, so a trace
// viewer goes from the duplicate to the original execution.
func (w *Worker) ledgerOutcome(d *delivery, outcome string, row *ledger.Row) {
	d.span.SetAttributes(tracing.KeyLedgerOutcome.String(outcome))
	if row == nil || row.TraceID == "" {
		return
	}
	if sc, ok := spanContextOf(row.TraceID, row.SpanID); ok && sc.SpanID() != d.span.SpanContext().SpanID() {
		d.span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
			attribute.String("toolq.link", "claimed_by"), tracing.KeyToolUseID.String(row.FirstToolUseID),
			attribute.String("toolq.attempt", strconv.FormatInt(row.Attempt, 10)),
		}})
	}
}

// endProcess ends the process span with the delivery's verdict.
func endProcess(d *delivery, verdict string, err error) {
	if d.span == nil {
		return
	}
	d.span.SetAttributes(attribute.String("toolq.verdict", verdict))
	if err != nil && verdict != "ack" {
		d.span.RecordError(err)
		if verdict == "dead_letter" {
			d.span.SetStatus(codes.Error, err.Error())
		}
	}
	d.span.End()
}

func spanContextOf(traceHex, spanHex string) (trace.SpanContext, bool) {
	var tid trace.TraceID
	var sid trace.SpanID
	tb, err1 := hex.DecodeString(traceHex)
	sb, err2 := hex.DecodeString(spanHex)
	if err1 != nil || err2 != nil || len(tb) != len(tid) || len(sb) != len(sid) {
		return trace.SpanContext{}, false
	}
	copy(tid[:], tb)
	copy(sid[:], sb)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	return sc, sc.IsValid()
}
