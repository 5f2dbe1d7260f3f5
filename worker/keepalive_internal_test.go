package worker

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
)

// progressMsg counts the InProgress calls of a heartbeat, and those made
// after its stop returned; block, when set, holds each call until closed.
type progressMsg struct {
	jetstream.Msg
	beats   atomic.Int32
	stopped atomic.Bool
	late    atomic.Int32
	block   chan struct{}
}

func (m *progressMsg) InProgress() error {
	if m.stopped.Load() {
		m.late.Add(1)
	}
	m.beats.Add(1)
	if m.block != nil {
		<-m.block
	}
	return nil
}

// beatingDelivery is a delivery of a tool without a ledger row whose
// heartbeat beats every 50 ms and gives up 1.001 s after its call starts.
func beatingDelivery(m jetstream.Msg) *delivery {
	ctx := context.Background()
	w := &Worker{log: slog.New(slog.NewTextHandler(io.Discard, nil)), ackWait: 150 * time.Millisecond}
	return &delivery{w: w, msg: m, tool: &tools.Tool{Name: "t", Timeout: time.Millisecond, Lease: 150 * time.Millisecond},
		ctx: ctx, runCtx: ctx, startCtx: ctx}
}

// A heartbeat stopped at any moment, around its beats and its give-up,
// some twice: once stop has returned, nothing keeps the delivery alive.
func TestNothingBeatsAfterTheHeartbeatStops(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	var late atomic.Int32
	for i := range 300 {
		wg.Go(func() {
			m := &progressMsg{}
			k := beatingDelivery(m).heartbeat(ledger.Fence{}, time.Now())
			if i%2 == 0 {
				k.beforeSend(context.Background()) // the give-up clock runs
			}
			time.Sleep(time.Duration(900+rand.IntN(200)) * time.Millisecond) // the stop lands anywhere around the give-up
			k.stop()
			m.stopped.Store(true)
			if i%3 == 0 {
				k.stop()
			}
			time.Sleep(120 * time.Millisecond) // more than two beats
			late.Add(m.late.Load())
		})
	}
	wg.Wait()
	if n := late.Load(); n != 0 {
		t.Fatalf("%d InProgress after stop returned", n)
	}
}

// A beat blocked (here in InProgress; in the ledger's Extend during an
// outage alike) does not hold back the give-up, no beat follows the
// give-up, and stop returns once the blocked beat does.
func TestAGiveUpIsNotHeldBackByABlockedBeat(t *testing.T) {
	t.Parallel()
	m := &progressMsg{block: make(chan struct{})}
	k := beatingDelivery(m).heartbeat(ledger.Fence{}, time.Now())
	if err := k.beforeSend(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the give-up", func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.gaveUp
	})
	if n := m.beats.Load(); n != 1 {
		t.Fatalf("%d beats began, want 1 (blocked)", n)
	}
	close(m.block)
	time.Sleep(200 * time.Millisecond) // four beats' time
	if n := m.beats.Load(); n != 1 {
		t.Fatalf("%d beats after the give-up, want none", n-1)
	}
	done := make(chan struct{})
	go func() { k.stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("stop does not return")
	}
}
