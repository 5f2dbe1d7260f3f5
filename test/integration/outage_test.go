package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/worker"
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

// TestLedgerCrashLosesAKeyedClaim: Postgres crashes right after a keyed
// write's claim, which did not wait for the disk, and loses it. The tool
// runs on; its completion finds no row and publishes nothing; the
// redelivery claims the key again at the same attempt and runs the call
// again under the same Idempotency-Key: the downstream has one payment and
// the agent one result. An unkeyed write's claim, in flight at the crash,
// waited for the disk: it survives, and its holder completes it.
func TestLedgerCrashLosesAKeyedClaim(t *testing.T) {
	t.Parallel()
	// Commits that wait reach the kernel, and survive the crash; the WAL
	// writer would carry the others there only after 10 s. The ack wait
	// outlasts the crash: no redelivery takes the unkeyed write over.
	o := options{ownCluster: true, ackWait: 15 * time.Second, pgSettings: []string{"synchronous_commit=on", "wal_writer_delay=10s"}}
	e := setup(t, o)
	keyed := job(conv(t), 0, "send_payment", payment("crash_keyed"))
	unkeyed := job(conv(t), 1, "create_ticket", `{"title":"crash","body":"unkeyed"}`)
	keyedKey, _ := keyed.Key()
	unkeyedKey, _ := unkeyed.Key()
	unkeyedClaimed, crashed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	crash := make(chan error, 1)
	e.startWorker(o, func(p worker.FaultPoint, j *jobs.Job) {
		if p != worker.AfterClaim {
			return
		}
		switch j.ToolUseID {
		case unkeyed.ToolUseID:
			once.Do(func() { close(unkeyedClaimed); <-crashed })
		case keyed.ToolUseID:
			select {
			case <-crashed:
				return // the claim after the lost one
			default:
			}
			defer close(crashed)
			crash <- func() error {
				if err := e.cluster.Crash(); err != nil {
					return err
				}
				if err := e.cluster.Start(); err != nil {
					return err
				}
				ctx := context.Background()
				for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					_, err := e.store.Get(ctx, keyedKey)
					if errors.Is(err, ledger.ErrUnavailable) {
						continue
					}
					if err == nil {
						return errors.New("the keyed claim survived the crash: it waited for the disk")
					}
					if !errors.Is(err, ledger.ErrNotFound) {
						return err
					}
					row, err := e.store.Get(ctx, unkeyedKey)
					if err != nil || row.State != ledger.InFlight {
						return fmt.Errorf("the unkeyed claim after the crash: %+v %v", row, err)
					}
					return nil
				}
				return errors.New("the ledger did not come back")
			}()
		}
	})
	e.publish(unkeyed)
	<-unkeyedClaimed
	p := e.publish(keyed)
	if err := <-crash; err != nil {
		t.Fatal(err)
	}
	if r := e.await(keyed); r.Status != jobs.StatusOK || r.Attempts != 1 || r.Duplicate {
		t.Fatalf("the keyed write after its claim was lost: %+v", r)
	}
	if r := e.await(unkeyed); r.Status != jobs.StatusOK || r.Attempts != 1 {
		t.Fatalf("the unkeyed write in flight at the crash: %+v", r)
	}
	for _, key := range []string{keyedKey, unkeyedKey} {
		if row, err := e.store.Get(context.Background(), key); err != nil || row.State != ledger.Completed || row.Attempt != 1 {
			t.Fatalf("row %s: %+v %v", key, row, err)
		}
	}
	if rs := e.results(keyed.ConversationID); len(rs) != 2 {
		t.Fatalf("%d results for two calls: %+v", len(rs), rs)
	}
	if pays := e.sandbox.Payments(); len(pays) != 1 || pays[0].IdempotencyKey != p.Key {
		t.Fatalf("payments %+v, want one under %s", pays, p.Key)
	}
	if n := len(e.sandbox.Tickets()); n != 1 {
		t.Fatalf("%d tickets", n)
	}
	if !strings.Contains(e.logs.String(), "lost the claim while the tool ran") {
		t.Fatalf("the keyed write's first holder did not see it lost its claim; logs:\n%s", e.logs.String())
	}
}
