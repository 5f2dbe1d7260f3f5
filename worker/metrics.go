package worker

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/tracing"
)

const meterName = "github.com/toolq/toolq/worker"

// secondsBuckets spans a fast ledger round trip to a tool's timeout.
var secondsBuckets = metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

// instruments are the worker's metrics. Keys and conversation ids stay on
// spans: metric attributes are bounded sets only (the registered tool, its
// class, the outcome, a duplicate's route, a dead letter's reason, the
// dependency of an outage, the downstream).
type instruments struct {
	attrs              attrSets
	jobs               metric.Int64Counter
	duplicates         metric.Int64Counter
	inFlight           metric.Int64UpDownCounter
	deadLetters        metric.Int64Counter
	deadLettersRefused metric.Int64Counter
	indeterminate      metric.Int64Counter
	takeovers          metric.Int64Counter
	outage             metric.Float64Counter
	claimLatency       metric.Float64Histogram
	toolLatency        metric.Float64Histogram
}

// How a duplicate came back, the toolq.duplicate.route label of
// toolq.duplicates.suppressed (see delivery.route).
const (
	routeNewToolUseID = "new_tool_use_id" // the retried turn: the same call under a new tool_use_id
	routeRedelivery   = "redelivery"      // the same message delivered again (its ack was lost, or it was handed back)
	routeReplay       = "replay"          // republished by an operator from TOOLQ_JOBS (Toolq-Replay-Of: <seq>)
	routeRequeue      = "requeue"         // requeued from the DLQ (Toolq-Replay-Of: dlq:<seq>)
	routeRepublish    = "republish"       // the same job published again outside the duplicate window
)

func newInstruments(mp metric.MeterProvider, reg *tools.Registry) (*instruments, error) {
	m := mp.Meter(meterName)
	var in instruments
	var err error
	if in.jobs, err = m.Int64Counter("toolq.jobs", metric.WithUnit("{job}"),
		metric.WithDescription("Deliveries settled, by outcome (toolq.outcome): ok, error, rejected, indeterminate, duplicate, retry, fenced, dead_letter.")); err != nil {
		return nil, err
	}
	if in.duplicates, err = m.Int64Counter("toolq.duplicates.suppressed", metric.WithUnit("{job}"),
		metric.WithDescription("Duplicate deliveries answered from the ledger without running the tool, by tool and route (toolq.duplicate.route): new_tool_use_id, redelivery, replay, requeue, republish.")); err != nil {
		return nil, err
	}
	if in.inFlight, err = m.Int64UpDownCounter("toolq.jobs.in_flight", metric.WithUnit("{job}"),
		metric.WithDescription("Deliveries being processed now.")); err != nil {
		return nil, err
	}
	if in.deadLetters, err = m.Int64Counter("toolq.dead_letters", metric.WithUnit("{job}"),
		metric.WithDescription("Messages published to the dead-letter stream, by reason (toolq.dlq.reason): invalid, too_large, max_deliver.")); err != nil {
		return nil, err
	}
	if in.deadLettersRefused, err = m.Int64Counter("toolq.dead_letters.refused", metric.WithUnit("{job}"),
		metric.WithDescription("Dead letters TOOLQ_DLQ refused even in their smallest form (toolq's headers, no body), by reason (toolq.dlq.reason): the job stays in TOOLQ_JOBS and is delivered again until the DLQ takes it. Above zero, an operator checks the DLQ stream's limits and permissions.")); err != nil {
		return nil, err
	}
	if in.indeterminate, err = m.Int64Counter("toolq.ledger.indeterminate", metric.WithUnit("{row}"),
		metric.WithDescription("Ledger rows this worker marked indeterminate, by tool: each waits for an operator (consumer ledger resolve).")); err != nil {
		return nil, err
	}
	if in.takeovers, err = m.Int64Counter("toolq.ledger.takeovers", metric.WithUnit("{row}"),
		metric.WithDescription("Expired leases this worker took over, by tool: their holder stopped mid-call (killed, stopped, cut off). A keyed write runs again with its key; an unkeyed write becomes indeterminate.")); err != nil {
		return nil, err
	}
	if in.outage, err = m.Float64Counter("toolq.outage.duration", metric.WithUnit("s"),
		metric.WithDescription("Time deliveries spent riding out an outage, by dependency (toolq.dependency): ledger or broker. Summed over deliveries: a rate above 1 is several deliveries waiting.")); err != nil {
		return nil, err
	}
	if in.claimLatency, err = m.Float64Histogram("toolq.claim.duration", metric.WithUnit("s"), secondsBuckets,
		metric.WithDescription("Time to claim a key in the ledger, batching included.")); err != nil {
		return nil, err
	}
	if in.toolLatency, err = m.Float64Histogram("toolq.tool.duration", metric.WithUnit("s"), secondsBuckets,
		metric.WithDescription("Time a tool call took, by tool and outcome.")); err != nil {
		return nil, err
	}
	// The series an alert or a dashboard watches exist from the start, at
	// zero, rather than from their first event: rate() and absence checks
	// then work on a worker that has seen none yet.
	ctx := context.Background()
	in.inFlight.Add(ctx, 0)
	for _, reason := range []string{jobs.DLQInvalid, jobs.DLQTooLarge, jobs.DLQMaxDeliver} {
		in.deadLetters.Add(ctx, 0, metric.WithAttributes(tracing.KeyDLQReason.String(reason)))
		in.deadLettersRefused.Add(ctx, 0, metric.WithAttributes(tracing.KeyDLQReason.String(reason)))
	}
	for _, dep := range []string{"ledger", "broker"} {
		in.outage.Add(ctx, 0, metric.WithAttributes(tracing.KeyDependency.String(dep)))
	}
	for _, t := range reg.Tools() {
		if !t.UsesLedger {
			continue
		}
		in.indeterminate.Add(ctx, 0, metric.WithAttributes(tracing.KeyTool.String(t.Name)))
		in.takeovers.Add(ctx, 0, metric.WithAttributes(tracing.KeyTool.String(t.Name)))
		for _, route := range []string{routeNewToolUseID, routeRedelivery, routeReplay, routeRequeue, routeRepublish} {
			in.duplicates.Add(ctx, 0, metric.WithAttributes(tracing.KeyTool.String(t.Name), tracing.KeyRoute.String(route)))
		}
	}
	// 0 closed, 1 half-open, 2 open, per downstream.
	_, err = m.Int64ObservableGauge("toolq.breaker.state", metric.WithDescription("Circuit breaker state per downstream: 0 closed, 1 half-open, 2 open."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			for downstream, state := range reg.BreakerStates() {
				o.Observe(map[string]int64{"closed": 0, "half-open": 1, "open": 2}[state], metric.WithAttributes(tracing.KeyDownstream.String(downstream)))
			}
			return nil
		}))
	return &in, err
}

// record counts how a delivery ended, once, in the stats and the metrics,
// and ends its span. The tool label is the registered tool's name, or
// "unknown" for a name the registry lacks, so that a sender cannot grow
// the label set.
func (w *Worker) record(d *delivery, o verdict) {
	w.stats.add(o.label)
	tool := d.toolLabel()
	ctx := context.Background()
	w.metrics.jobs.Add(ctx, 1, w.metrics.attrs.of("jobs", string(o.label), tool, func() []attribute.KeyValue {
		return []attribute.KeyValue{tracing.KeyOutcome.String(string(o.label)), tracing.KeyTool.String(tool)}
	}))
	if o.label == OutcomeDuplicate {
		w.metrics.duplicates.Add(ctx, 1, w.metrics.attrs.of("duplicates", tool, d.dupRoute, func() []attribute.KeyValue {
			return []attribute.KeyValue{tracing.KeyTool.String(tool), tracing.KeyRoute.String(d.dupRoute)}
		}))
	}
	if o.verb == verbDeadLetter { // published: settle turned a dead letter it could not publish into a retry
		w.metrics.deadLetters.Add(ctx, 1, metric.WithAttributes(tracing.KeyDLQReason.String(o.reason)))
	}
	if d.span != nil { // started (a delivery handed back by the drain never was)
		w.metrics.inFlight.Add(ctx, -1)
	}
	d.endSpan(o)
}

// toolLabel is the registered tool's name, or "unknown".
func (d *delivery) toolLabel() string {
	if d.tool != nil {
		return d.tool.Name
	}
	return "unknown"
}

// countRefusedDeadLetter counts a dead letter TOOLQ_DLQ refused in its
// smallest form.
func (w *Worker) countRefusedDeadLetter(reason string) {
	w.metrics.deadLettersRefused.Add(context.Background(), 1, metric.WithAttributes(tracing.KeyDLQReason.String(reason)))
}

// countIndeterminate counts a row this delivery marked indeterminate.
func (d *delivery) countIndeterminate() {
	d.w.metrics.indeterminate.Add(context.Background(), 1, metric.WithAttributes(tracing.KeyTool.String(d.toolLabel())))
}

// countTakeover counts an expired lease taken over from a holder that
// stopped mid-call.
func (d *delivery) countTakeover() {
	d.w.metrics.takeovers.Add(context.Background(), 1, metric.WithAttributes(tracing.KeyTool.String(d.toolLabel())))
}

// countOutage adds time spent waiting out an outage of what durably was
// doing: publishing a result waits for the broker, the rest for the ledger.
func (d *delivery) countOutage(what string, spent time.Duration) {
	dep := "ledger"
	if what == "publish result" {
		dep = "broker"
	}
	d.w.metrics.outage.Add(context.Background(), spent.Seconds(), metric.WithAttributes(tracing.KeyDependency.String(dep)))
}

// route is how a duplicate of row came back: through a replay or a requeue
// (their header), under a new tool_use_id (the retried turn), as the same
// message delivered again, or, with none of these, as the same job
// published again after the stream's duplicate window.
func (d *delivery) route(row ledger.Row) string {
	switch replayOf := d.msg.Headers().Get(jobs.HeaderReplayOf); {
	case strings.HasPrefix(replayOf, "dlq:"):
		return routeRequeue
	case replayOf != "":
		return routeReplay
	case row.FirstToolUseID != d.job.ToolUseID:
		return routeNewToolUseID
	case d.deliveries > 1:
		return routeRedelivery
	default:
		return routeRepublish
	}
}

func (w *Worker) observeTool(d *delivery, start time.Time, outcome tools.Outcome) {
	w.metrics.toolLatency.Record(context.Background(), time.Since(start).Seconds(), w.metrics.attrs.of("tool", d.tool.Name, outcome.String(), func() []attribute.KeyValue {
		return []attribute.KeyValue{tracing.KeyTool.String(d.tool.Name), tracing.KeyToolClass.String(string(d.tool.Class)),
			tracing.KeyToolOutcome.String(outcome.String())}
	}))
}

// attrSets keeps the attribute sets of the per-delivery measurements, one
// per metric and label values, so that a delivery does not build and sort
// them again: the labels are bounded (registered tools, outcomes, routes).
type attrSets struct{ m sync.Map } // [3]string → metric.MeasurementOption

// of returns the option for metric's labels a and b, made by attrs the
// first time.
func (c *attrSets) of(metricName, a, b string, attrs func() []attribute.KeyValue) metric.MeasurementOption {
	key := [3]string{metricName, a, b}
	if opt, ok := c.m.Load(key); ok {
		return opt.(metric.MeasurementOption)
	}
	opt, _ := c.m.LoadOrStore(key, metric.WithAttributeSet(attribute.NewSet(attrs()...)))
	return opt.(metric.MeasurementOption)
}
