package worker

import (
	"context"
	"encoding/hex"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tracing"
)

const tracerName = "github.com/toolq/toolq/worker"

// finding is what the claim found, recorded on the process span as
// toolq.ledger.outcome.
type finding string

const (
	ledgerNone       finding = "none"        // the tool runs without a claim
	ledgerClaimed    finding = "claimed"     // this delivery claimed the key first
	ledgerDuplicate  finding = "duplicate"   // another delivery settled the call
	ledgerInFlight   finding = "in_flight"   // another attempt holds the lease
	ledgerTakeover   finding = "takeover"    // a keyed write's holder died: run again with the same key
	ledgerHolderLost finding = "holder_lost" // an unkeyed write's holder died: indeterminate
	ledgerCollision  finding = "collision"   // the row holds another call's material
)

// startSpan starts the consumer span of the delivery, a child of the
// publisher's send span when the job carries its trace context, with what
// decode learned.
func (d *delivery) startSpan() {
	w := d.w
	parent := w.propagator.Extract(d.runCtx, jobs.HeaderCarrier(d.msg.Headers()))
	w.metrics.inFlight.Add(context.Background(), 1) // until record
	if w.spansOff {
		// The no-op tracer reads neither a name nor options: its span is
		// the publisher's span context, not recording, or none.
		d.ctx, d.span = w.tracer.Start(parent, "process")
		return
	}
	// The attributes are given at the start: a sampler decides on them.
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

// Why a duplicate ran nothing, on its toolq.duplicate event.
const (
	reasonCompletedBefore = "completed_before"     // another delivery completed or failed the call
	reasonWaitedInFlight  = "waited_for_in_flight" // another attempt was running; this delivery waited for its result
	reasonIndeterminate   = "indeterminate"        // the call's outcome is unknown: an operator resolves it
	reasonCollision       = "collision"            // the key holds another call's material
)

// explainDuplicate records on the process span why nothing ran, with the
// original's tool_use_id (beside the link noteFinding adds), and the
// route the duplicate came by for the metrics. row is nil for a collision.
func (d *delivery) explainDuplicate(found finding, row *ledger.Row) {
	if row != nil {
		d.dupRoute = d.route(*row)
	}
	if !d.span.IsRecording() {
		return
	}
	reason := reasonCompletedBefore
	attrs := []attribute.KeyValue{}
	switch {
	case row == nil:
		reason = reasonCollision
	case row.State == ledger.Indeterminate:
		reason = reasonIndeterminate
	case found == ledgerInFlight:
		reason = reasonWaitedInFlight
	}
	if row != nil {
		attrs = append(attrs, tracing.KeyOriginalToolUseID.String(row.FirstToolUseID), tracing.KeyRoute.String(d.dupRoute),
			tracing.KeyAttempt.String(strconv.FormatInt(row.Attempt, 10)))
	}
	d.span.AddEvent("toolq.duplicate", trace.WithAttributes(append(attrs, tracing.KeyReason.String(reason))...))
}

// toolAttrs are the attributes of the span of a tool call's attempt.
func (d *delivery) toolAttrs(attempt int64) func() []attribute.KeyValue {
	return func() []attribute.KeyValue {
		return []attribute.KeyValue{tracing.ExecuteTool, tracing.GenAIToolName.String(d.tool.Name), tracing.GenAIToolCallID.String(d.job.ToolUseID),
			tracing.GenAIToolType.String("function"),
			tracing.KeyTool.String(d.tool.Name), tracing.KeyToolClass.String(string(d.tool.Class)),
			tracing.KeyDownstream.String(d.tool.Downstream), tracing.KeyAttempt.Int64(attempt)}
	}
}

// ledgerAttrs are the database attributes of a span of the ledger
// operation op (claim, settle).
func (w *Worker) ledgerAttrs(op string, more ...attribute.KeyValue) func() []attribute.KeyValue {
	return func() []attribute.KeyValue {
		return append([]attribute.KeyValue{tracing.DBSystemName(w.cfg.Ledger.Backend()), tracing.DBCollection.String("toolq_ledger"), tracing.DBOperation.String(op)}, more...)
	}
}

// child starts a span under the delivery's process span, on ctx's
// deadlines and cancellation, with the attributes attrs makes (given at the
// start, for the sampler; not made when the tracer records nothing).
func (d *delivery) child(ctx context.Context, name string, kind trace.SpanKind, attrs func() []attribute.KeyValue) (context.Context, trace.Span) {
	ctx = trace.ContextWithSpan(ctx, d.span)
	if d.w.spansOff {
		// The no-op tracer's child of a span that does not record is that
		// span: asking it would only allocate its options.
		return ctx, d.span
	}
	return d.w.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs()...))
}

// isNoop reports whether tp is OpenTelemetry's no-op provider, whose spans
// never record.
func isNoop(tp trace.TracerProvider) bool {
	_, ok := tp.(noop.TracerProvider)
	return ok
}

// noteFinding records what the claim found on the process span; for a
// row another delivery claimed it links to that delivery's span, so a trace
// viewer goes from the duplicate to the original execution.
func (d *delivery) noteFinding(found finding, row *ledger.Row) {
	if !d.span.IsRecording() {
		return
	}
	d.span.SetAttributes(tracing.KeyLedgerOutcome.String(string(found)))
	if row == nil || row.TraceID == "" {
		return
	}
	if sc, ok := spanContextOf(row.TraceID, row.SpanID); ok && sc.SpanID() != d.span.SpanContext().SpanID() {
		d.span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
			tracing.KeyLink.String("claimed_by"), tracing.KeyToolUseID.String(row.FirstToolUseID),
			tracing.KeyAttempt.String(strconv.FormatInt(row.Attempt, 10)),
		}})
	}
}

// endSpan ends the process span with the delivery's verdict.
func (d *delivery) endSpan(o verdict) {
	if d.span == nil {
		return
	}
	if !d.span.IsRecording() {
		d.span.End()
		return
	}
	d.span.SetAttributes(tracing.KeyVerdict.String(o.verb.String()), tracing.KeyOutcome.String(string(o.label)))
	if o.err != nil {
		d.span.RecordError(o.err)
		if o.verb == verbDeadLetter {
			d.span.SetAttributes(tracing.KeyDLQReason.String(o.reason))
			d.span.SetStatus(codes.Error, o.err.Error())
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
