package worker

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/toolq/toolq/tools"
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
		metric.WithDescription("Deliveries settled, by outcome: ok, error, rejected, indeterminate, duplicate, retry, dead_letter, fenced.")); err != nil {
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
				o.Observe(map[string]int64{"closed": 0, "half-open": 1, "open": 2}[state], metric.WithAttributes(attribute.String("toolq.downstream", downstream)))
			}
			return nil
		}))
	return &in, err
}

// count records a settled delivery in the stats and the metrics.
func (w *Worker) count(d *delivery, outcome string) {
	w.stats.add(outcome)
	attrs := []attribute.KeyValue{attribute.String("toolq.outcome", outcome)}
	if d.job != nil {
		attrs = append(attrs, attribute.String("toolq.tool", d.job.Tool))
	}
	w.metrics.jobs.Add(context.Background(), 1, metric.WithAttributes(attrs...))
	if outcome == "duplicate" {
		w.metrics.duplicates.Add(context.Background(), 1, metric.WithAttributes(attrs[1:]...))
	}
}

func (w *Worker) observeTool(d *delivery, start time.Time, outcome tools.Outcome) {
	w.metrics.toolLatency.Record(context.Background(), time.Since(start).Seconds(), metric.WithAttributes(
		attribute.String("toolq.tool", d.tool.Name), attribute.String("toolq.tool.class", string(d.tool.Class)),
		attribute.String("toolq.tool.outcome", outcome.String())))
}
