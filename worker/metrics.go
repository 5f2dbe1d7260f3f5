package worker

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/tracing"
)

const meterName = "github.com/toolq/toolq/worker"

// secondsBuckets spans a fast ledger round trip to a tool's timeout.
var secondsBuckets = metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

// instruments are the worker's metrics. Keys and conversation ids stay on
// spans: metric attributes are only the tool, its class and the outcome.
type instruments struct {
	jobs         metric.Int64Counter
	duplicates   metric.Int64Counter
	claimLatency metric.Float64Histogram
	toolLatency  metric.Float64Histogram
}

func newInstruments(mp metric.MeterProvider, reg *tools.Registry) (*instruments, error) {
	m := mp.Meter(meterName)
	var in instruments
	var err error
	if in.jobs, err = m.Int64Counter("toolq.jobs", metric.WithUnit("{job}"),
		metric.WithDescription("Deliveries settled, by outcome (toolq.outcome): ok, error, rejected, indeterminate, duplicate, retry, fenced, dead_letter.")); err != nil {
		return nil, err
	}
	if in.duplicates, err = m.Int64Counter("toolq.duplicates.suppressed", metric.WithUnit("{job}"),
		metric.WithDescription("Duplicate deliveries answered from the ledger without running the tool.")); err != nil {
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
func (w *Worker) record(d *delivery, o outcome) {
	w.stats.add(o.label)
	tool := "unknown"
	if d.tool != nil {
		tool = d.tool.Name
	}
	attrs := metric.WithAttributes(tracing.KeyOutcome.String(string(o.label)), tracing.KeyTool.String(tool))
	w.metrics.jobs.Add(context.Background(), 1, attrs)
	if o.label == OutcomeDuplicate {
		w.metrics.duplicates.Add(context.Background(), 1, metric.WithAttributes(tracing.KeyTool.String(tool)))
	}
	d.endSpan(o)
}

func (w *Worker) observeTool(d *delivery, start time.Time, outcome tools.Outcome) {
	w.metrics.toolLatency.Record(context.Background(), time.Since(start).Seconds(), metric.WithAttributes(
		tracing.KeyTool.String(d.tool.Name), tracing.KeyToolClass.String(string(d.tool.Class)),
		tracing.KeyToolOutcome.String(outcome.String())))
}
