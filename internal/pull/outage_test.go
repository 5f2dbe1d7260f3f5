package pull_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/pull"
	"github.com/toolq/toolq/internal/testenv"
)

// outageNext reads one message, then takes the server down and calls next
// once, with the server down for outage, and returns what that call gave
// and how long after the shutdown it returned. The server is restarted
// after outage and a message published.
func outageNext(t *testing.T, wrap func(jetstream.MessagesContext, *nats.Conn) func() (jetstream.Msg, error)) (jetstream.Msg, time.Duration, error) {
	n := testenv.StartNATS(t)
	nc := n.Connect()
	js, ctx := stream(t, nc)
	cons, err := js.CreateOrUpdateConsumer(ctx, "P", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	// Heartbeat 1 s, missed-heartbeat timer 2 s (the worker: 2.5 s, 5 s).
	raw, err := cons.Messages(jetstream.PullMaxMessages(16), jetstream.PullExpiry(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(raw.Stop)
	next := wrap(raw, nc)
	if _, err := js.Publish(ctx, "p.x", []byte("before")); err != nil {
		t.Fatal(err)
	}
	m, err := next()
	if err != nil || string(m.Data()) != "before" {
		t.Fatalf("before the outage: %v, %v", m, err)
	}
	m.Ack()
	nc.Flush()

	type res struct {
		m   jetstream.Msg
		err error
		at  time.Time
	}
	got := make(chan res, 1)
	go func() {
		m, err := next()
		got <- res{m, err, time.Now()}
	}()
	// Next is waiting when the server goes down, as the worker's puller is
	// (and still within the quiet second, as under load).
	time.Sleep(200 * time.Millisecond)
	down := time.Now()
	n.Shutdown()
	const outage = 6 * time.Second
	select {
	case r := <-got:
		return r.m, r.at.Sub(down), r.err
	case <-time.After(outage):
	}
	n.Restart()
	testenv.Eventually(t, 10*time.Second, "reconnected", nc.IsConnected)
	go func() {
		// publish once the consumer is back
		for range 50 {
			if _, err := js.Publish(ctx, "p.x", []byte("after")); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	select {
	case r := <-got:
		return r.m, r.at.Sub(down), r.err
	case <-time.After(20 * time.Second):
		t.Fatal("Next never returned after the restart")
	}
	return nil, 0, nil
}

// TestIterRidesOutAnOutage: a Next waiting when the server goes down, still
// within the quiet second (as under load), waits through the outage as the
// library's iterator does and returns the next message after the restart.
// A slice takes the iterator's notice of the disconnect; a wait in one
// piece begun after it would report a missed heartbeat while the server is
// simply down.
func TestIterRidesOutAnOutage(t *testing.T) {
	t.Parallel()
	m, after, err := outageNext(t, func(it jetstream.MessagesContext, nc *nats.Conn) func() (jetstream.Msg, error) {
		return pull.New(it, nc).Next
	})
	if err != nil {
		t.Fatalf("pull.Iter: Next during the outage returned %v after %v; the raw iterator waits for the reconnect", err, after.Round(time.Millisecond))
	}
	t.Logf("pull.Iter: %q after %v", m.Data(), after.Round(time.Millisecond))
}

// TestIterDoesNotPileUpPullRequestsDuringAnOutage: a reader that keeps
// calling Next through an outage (as the worker's puller does: it logs the
// error and reads on) must not leave more pull requests waiting on the
// server after the reconnect than the iterator's accounting allows (one
// outstanding batch, plus at most one refill). Every missed-heartbeat error
// pull.Iter reports while the server is down resets the accounting, and the
// request the next call makes goes into the reconnect buffer; all of them
// reach the server at the reconnect, and the server then delivers more
// than the client's buffer (PullMaxMessages) holds: the rest is dropped as
// a slow consumer and waits out AckWait.
func TestIterDoesNotPileUpPullRequestsDuringAnOutage(t *testing.T) {
	t.Parallel()
	pileUp(t, func(it jetstream.MessagesContext, nc *nats.Conn) func() (jetstream.Msg, error) {
		return pull.New(it, nc).Next
	})
}

func pileUp(t *testing.T, wrap func(jetstream.MessagesContext, *nats.Conn) func() (jetstream.Msg, error)) {
	n := testenv.StartNATS(t)
	slow := make(chan struct{}, 1000)
	nc := n.Connect(nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if err == nats.ErrSlowConsumer {
			slow <- struct{}{}
		}
	}))
	js, ctx := stream(t, nc)
	cons, raw := pulling(t, js, ctx, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	next := wrap(raw, nc)
	if _, err := js.Publish(ctx, "p.x", []byte("before")); err != nil {
		t.Fatal(err)
	}
	if m, err := next(); err != nil {
		t.Fatal(err)
	} else {
		m.Ack()
	}
	nc.Flush()
	var errs atomic.Int64
	stopReading := make(chan struct{})
	read := make(chan jetstream.Msg, 1000)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			select {
			case <-stopReading:
				return
			default:
			}
			m, err := next()
			if err != nil {
				errs.Add(1)
				continue
			}
			read <- m
			// a reader busy with its message for a moment (the worker's
			// slot wait, a handler) while the burst arrives
			time.Sleep(5 * time.Millisecond)
		}
	}()
	time.Sleep(200 * time.Millisecond) // Next is waiting when the server goes down
	n.Shutdown()
	time.Sleep(6 * time.Second)
	outageErrs := errs.Load()
	n.Restart()
	testenv.Eventually(t, 10*time.Second, "reconnected", nc.IsConnected)
	time.Sleep(300 * time.Millisecond)
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiting := ci.NumWaiting
	for i := range 200 {
		if _, err := js.Publish(ctx, "p.x", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Second) // 200 × 5 ms: time enough to read them all
	close(stopReading)
	raw.Stop()
	<-readerDone
	t.Logf("errors during the outage: %d; pull requests waiting after the reconnect: %d; read %d of 200; slow-consumer drops reported: %d", outageErrs, waiting, len(read), len(slow))
	if waiting > 2 || len(slow) > 0 || len(read) < 200 {
		t.Fatalf("%d pull requests waiting on the server after the reconnect (%d errors reported during the outage), %d slow-consumer drop events, %d of 200 published messages not received within 5 s (ack wait 1 min): the accounting no longer bounds what the server may send", waiting, outageErrs, len(slow), 200-len(read))
	}
}
