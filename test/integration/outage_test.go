package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// TestLedgerOutage: Postgres stops while a tool runs and while new jobs
// arrive. The worker keeps the outcome and the jobs (telling JetStream they
// are in progress) and finishes them when Postgres is back: one payment per
// call, no dead letter, no redelivery. The time spent waiting is counted as
// a ledger outage.
func TestLedgerOutage(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	o := options{ownCluster: true, faults: sandbox.Faults{LatencyMS: 1000}, meters: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}
	e := setup(t, o)
	e.startWorker(o, nil)
	running := job(conv(t), 0, "send_payment", payment("outage_running"))
	p := e.publish(running)
	testenv.Eventually(t, 10*time.Second, "the call in flight", func() bool {
		r, err := e.store.Get(context.Background(), p.Key)
		return err == nil && r.State == ledger.InFlight
	})
	if err := e.cluster.Stop(); err != nil {
		t.Fatal(err)
	}
	arriving := job(conv(t), 1, "send_payment", payment("outage_arriving"))
	e.publish(arriving)
	testenv.Eventually(t, 20*time.Second, "the worker to notice the outage", func() bool {
		logs := e.logs.String()
		return strings.Contains(logs, "complete failed; retrying") && strings.Contains(logs, "claim failed; retrying")
	})
	// Stay down longer than the ack wait: without InProgress JetStream would
	// redeliver the jobs meanwhile.
	time.Sleep(o.consumer().AckWait + time.Second)
	if err := e.cluster.Start(); err != nil {
		t.Fatal(err)
	}
	for _, j := range []*jobs.Job{running, arriving} {
		if r := e.await(j); r.Status != jobs.StatusOK || r.Attempts != 1 {
			t.Fatalf("result %+v", r)
		}
	}
	info := e.settled()
	if info.NumRedelivered != 0 || len(e.deadLetters()) != 0 {
		t.Fatalf("the outage cost deliveries: %+v", info)
	}
	if n := len(e.sandbox.Payments()); n != 2 {
		t.Fatalf("%d payments for 2 calls", n)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	outage := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[float64]); ok && m.Name == "toolq.outage.duration" {
				for _, dp := range sum.DataPoints {
					dep, _ := dp.Attributes.Value("toolq.dependency")
					outage[dep.AsString()] += dp.Value
				}
			}
		}
	}
	// Two deliveries each waited through the time the cluster was down.
	if min := 2 * o.consumer().AckWait.Seconds(); outage["ledger"] < min || outage["broker"] != 0 {
		t.Fatalf("outage seconds %v, want ledger ≥ %.0f and no broker outage", outage, min)
	}
}

// TestBrokerRestart: the NATS server restarts (same store) under a running
// worker; jobs published before and after are all processed.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	e.startWorker(options{}, nil)
	before := job(conv(t), 0, "send_payment", payment("before_restart"))
	e.publish(before)
	e.await(before)
	e.nats.Restart()
	after := job(conv(t), 1, "send_payment", payment("after_restart"))
	testenv.Eventually(t, 20*time.Second, "publishing after the restart", func() bool {
		_, err := e.client.Publish(context.Background(), after)
		return err == nil
	})
	if r := e.await(after); r.Status != jobs.StatusOK {
		t.Fatalf("result %+v", r)
	}
	again := job(conv(t), 0, "send_payment", payment("before_restart"))
	e.publish(again)
	if r := e.await(again); !r.Duplicate {
		t.Fatalf("the ledger forgot across a broker restart: %+v", r)
	}
	if n := len(e.sandbox.Payments()); n != 2 {
		t.Fatalf("%d payments", n)
	}
}
