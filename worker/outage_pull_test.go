package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestBrokerOutageUnderLoadCostsNoRedeliveries: the broker goes down while
// the worker is busy (a job came within the last second), for 12 s, and
// comes back; then a burst of jobs arrives while the worker's one slot is
// taken. Every job must be answered without a redelivery (ack wait 30 s).
//
// A wait that reported missed heartbeats during the outage would reset the
// pull accounting each time and queue one more pull request in the
// reconnect buffer; at the reconnect the server would send more than the
// client's buffer of BatchSize holds, and the rest, dropped as a slow
// consumer, would wait out the ack wait and come back as counted
// deliveries (internal/pull).
func TestBrokerOutageUnderLoadCostsNoRedeliveries(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n := testenv.StartNATS(t)
	var slow atomic.Int64
	nc := n.Connect(nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if err == nats.ErrSlowConsumer {
			slow.Add(1)
		}
	}))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	store := sqliteStore(t)
	var hold atomic.Bool
	gate := make(chan struct{})
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		if hold.Load() {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return json.RawMessage(`{"ok":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "read", Class: tools.Read, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	const batch = 16
	w, err := worker.New(ctx, worker.Config{JS: js, Ledger: store, Tools: reg, BatchSize: batch, MaxInFlight: 1,
		Consumer: worker.Consumer{AckWait: 30 * time.Second}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		close(gate)
		stop()
		<-done
	}()
	client := jobs.NewClient(js)
	job := func(i int) *jobs.Job {
		return &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: "read", ToolUseID: fmt.Sprintf("toolu_%d", i), Args: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	actx, acancel := context.WithTimeout(ctx, 20*time.Second)
	if r, err := client.PublishAndAwait(actx, job(0)); err != nil || r.Status != jobs.StatusOK {
		t.Fatalf("job 0: %v %v", r, err)
	}
	acancel()

	n.Shutdown() // the worker had a job within the last second
	time.Sleep(12 * time.Second)
	n.Restart()
	testenv.Eventually(t, 20*time.Second, "reconnected", nc.IsConnected)
	time.Sleep(300 * time.Millisecond)

	hold.Store(true)
	const burst = 100
	for i := 1; i <= burst; i++ {
		testenv.Eventually(t, 20*time.Second, "publishing after the restart", func() bool {
			_, err := client.Publish(ctx, job(i))
			return err == nil
		})
	}
	time.Sleep(time.Second) // the deliveries arrive while the slot is taken
	hold.Store(false)
	gate <- struct{}{} // the one held call
	cons, err := js.Consumer(ctx, jobs.JobsStream, worker.Consumer{}.Config().Durable)
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.ConsumerInfo
	deadline := time.Now().Add(20 * time.Second) // less than the ack wait
	for {
		info, err = cons.Info(ctx)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	warned := strings.Count(logs.String(), "no heartbeat")
	t.Logf("missed-heartbeat warnings during the outage: %d; slow-consumer events: %d; consumer: pending %d, ack pending %d, redelivered %d",
		warned, slow.Load(), info.NumPending, info.NumAckPending, info.NumRedelivered)
	if info.NumPending != 0 || info.NumAckPending != 0 || info.NumRedelivered != 0 || slow.Load() != 0 {
		t.Fatalf("after a 12 s broker outage, %d jobs were not answered within 20 s (%d awaiting an ack that was dropped on arrival, ack wait 30 s), %d redelivered, %d slow-consumer drops; %d missed-heartbeat errors were reported while the broker was down",
			info.NumPending+uint64(info.NumAckPending), info.NumAckPending, info.NumRedelivered, slow.Load(), warned)
	}
}
