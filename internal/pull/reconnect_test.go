package pull_test

import (
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/pull"
	"github.com/toolq/toolq/internal/testenv"
)

// blackhole takes the server's port once it is down and accepts
// connections without ever answering (a broker that is unreachable at the
// protocol level: hung, or behind a half-open path). It returns a channel
// that receives once the client has connected to it, i.e. once nats.go is
// inside a reconnect attempt's handshake.
func blackhole(t *testing.T, n *testenv.NATS) <-chan struct{} {
	t.Helper()
	addr := strings.TrimPrefix(n.URL, "nats://")
	n.Shutdown()
	var ln net.Listener
	var err error
	for range 100 {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	accepted := make(chan struct{}, 1)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return accepted
}

// bufferedDuringReconnect: two messages are in the iterator's buffer; the
// reader takes the first, is busy for longer than pull.Quiet (as the
// worker's puller is while every slot is taken), and comes back while the
// client is in a reconnect attempt to a broker that does not answer. It
// returns how long the call for the second, already buffered, message took.
func bufferedDuringReconnect(t *testing.T, wrap func(jetstream.MessagesContext, *nats.Conn) func() (jetstream.Msg, error)) time.Duration {
	n := testenv.StartNATS(t)
	nc := n.Connect() // nats.go's default connect Timeout: 2 s
	js, ctx := stream(t, nc)
	_, raw := pulling(t, js, ctx, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy})
	t.Cleanup(raw.Stop)
	next := wrap(raw, nc)
	for _, s := range []string{"one", "two"} {
		if _, err := js.Publish(ctx, "p.x", []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := next(); err != nil || string(m.Data()) != "one" {
		t.Fatalf("first: %v, %v", m, err)
	}
	time.Sleep(300 * time.Millisecond) // "two" is in the buffer
	time.Sleep(pull.Quiet)             // the reader is busy
	accepted := blackhole(t, n)
	select {
	case <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("the client never tried to reconnect")
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	m, err := next()
	took := time.Since(start)
	if err != nil || string(m.Data()) != "two" {
		t.Fatalf("second: %v, %v after %v", m, err, took)
	}
	return took
}

// TestIterHandsOutBufferedMessageDuringReconnect: a reader back after
// Quiet, while the client tries to reconnect to a broker that accepts and
// never answers, gets the message already in the buffer at once.
// nc.IsConnected takes the connection's lock, which nats.go holds for the
// whole of each reconnect attempt (up to the connect timeout), so Iter asks
// it only after a slice found nothing.
func TestIterHandsOutBufferedMessageDuringReconnect(t *testing.T) {
	t.Parallel()
	took := bufferedDuringReconnect(t, func(it jetstream.MessagesContext, nc *nats.Conn) func() (jetstream.Msg, error) {
		return pull.New(it, nc).Next
	})
	t.Logf("pull.Iter: buffered message after %v", took.Round(time.Millisecond))
	if took > 500*time.Millisecond {
		t.Fatalf("pull.Iter returned a message that was already buffered after %v (the raw iterator: at once): it waited in nc.IsConnected() for nats.go's reconnect attempt to time out", took.Round(time.Millisecond))
	}
}

// TestClosedForGood: the connection closed for good ends Next
// promptly, in a slice or in one piece, with ErrMsgIteratorClosed, and
// later calls return at once (no loop inside Iter).
func TestClosedForGood(t *testing.T) {
	t.Parallel()
	for _, quiet := range []bool{false, true} {
		n := testenv.StartNATS(t)
		nc := n.Connect()
		js, ctx := stream(t, nc)
		_, raw := pulling(t, js, ctx, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy})
		it := pull.New(raw, nc)
		if quiet {
			time.Sleep(pull.Quiet + 100*time.Millisecond)
		}
		got := make(chan error, 1)
		go func() {
			_, err := it.Next()
			got <- err
		}()
		time.Sleep(200 * time.Millisecond)
		nc.Close()
		select {
		case err := <-got:
			if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				t.Fatalf("quiet %v: %v", quiet, err)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("quiet %v: Next still waiting 3 s after the connection closed", quiet)
		}
		start := time.Now()
		for range 100 {
			if _, err := it.Next(); !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				t.Fatalf("again: %v", err)
			}
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Fatalf("100 calls after the close took %v", d)
		}
	}
}

// counting counts the waits made on an iterator.
type counting struct {
	jetstream.MessagesContext
	untimed, timed atomic.Int64
}

func (c *counting) Next(opts ...jetstream.NextOpt) (jetstream.Msg, error) {
	if len(opts) == 0 {
		c.untimed.Add(1)
	} else {
		c.timed.Add(1)
	}
	return c.MessagesContext.Next(opts...)
}

// TestWaitsWhenIdle counts the iterator's waits: connected and
// quiet, one; disconnected, one per Recheck for as long as it lasts.
func TestWaitsWhenIdle(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	nc := n.Connect()
	js, ctx := stream(t, nc)
	_, raw := pulling(t, js, ctx, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy})
	t.Cleanup(raw.Stop)
	shim := &counting{MessagesContext: raw}
	it := pull.New(shim, nc)
	go it.Next()
	time.Sleep(3 * time.Second)
	idleTimed, idleUntimed := shim.timed.Load(), shim.untimed.Load()
	n.Shutdown()
	time.Sleep(3 * time.Second)
	t.Logf("connected, 3 s from New: %d sliced waits, %d in one piece; then 3 s disconnected: %d more sliced waits, %d more in one piece",
		idleTimed, idleUntimed, shim.timed.Load()-idleTimed, shim.untimed.Load()-idleUntimed)
	if idleUntimed != 1 || idleTimed > 25 {
		t.Fatalf("idle and connected: %d sliced waits, %d in one piece", idleTimed, idleUntimed)
	}
}

// TestShortOutageWhileFlowing: messages flow (one every 100 ms) when
// the server restarts at once, so both of the iterator's notices are taken
// by slices. The reconnect notice must still reset the accounting: the
// flow resumes within a couple of seconds, without extra pull requests or
// slow-consumer drops.
func TestShortOutageWhileFlowing(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	var slow atomic.Int64
	nc := n.Connect(nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if err == nats.ErrSlowConsumer {
			slow.Add(1)
		}
	}))
	js, ctx := stream(t, nc)
	cons, raw := pulling(t, js, ctx, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy})
	shim := &counting{MessagesContext: raw}
	it := pull.New(shim, nc)
	var lastAt atomic.Int64
	var errs atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := it.Next()
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			if err != nil {
				errs.Add(1)
				continue
			}
			m.Ack()
			lastAt.Store(time.Now().UnixNano())
		}
	}()
	stopPub := make(chan struct{})
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for {
			select {
			case <-stopPub:
				return
			case <-time.After(100 * time.Millisecond):
			}
			js.Publish(ctx, "p.x", []byte("x"))
		}
	}()
	time.Sleep(time.Second)
	untimedBefore := shim.untimed.Load()
	n.Restart()
	restarted := time.Now()
	testenv.Eventually(t, 10*time.Second, "reconnected", nc.IsConnected)
	testenv.Eventually(t, 10*time.Second, "a message after the restart", func() bool {
		return time.Unix(0, lastAt.Load()).After(restarted)
	})
	resumed := time.Unix(0, lastAt.Load()).Sub(restarted)
	time.Sleep(time.Second)
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	close(stopPub)
	<-pubDone
	raw.Stop()
	<-done
	t.Logf("flow resumed %v after the restart; waits in one piece during it: %d; errors: %d; pull requests waiting: %d; slow-consumer drops: %d",
		resumed.Round(time.Millisecond), shim.untimed.Load()-untimedBefore, errs.Load(), ci.NumWaiting, slow.Load())
	if resumed > 3*time.Second || ci.NumWaiting > 2 || slow.Load() > 0 || errs.Load() > 0 {
		t.Fatal("the short outage was not ridden out")
	}
}

// TestOrderedConsumerAcrossRestart: an ordered consumer (memory
// storage: lost with the server) read through pull.Iter is reset after a
// restart, whether the reconnect notice is taken by a slice (messages were
// flowing) or by a wait in one piece (quiet).
func TestOrderedConsumerAcrossRestart(t *testing.T) {
	t.Parallel()
	for _, quiet := range []bool{false, true} {
		n := testenv.StartNATS(t)
		nc := n.Connect()
		js, ctx := stream(t, nc)
		cons, err := js.OrderedConsumer(ctx, "P", jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := cons.Messages()
		if err != nil {
			t.Fatal(err)
		}
		it := pull.New(raw, nc)
		got := make(chan string, 10)
		errc := make(chan error, 1)
		go func() {
			for {
				m, err := it.Next()
				if err != nil {
					errc <- err
					return
				}
				got <- string(m.Data())
			}
		}()
		time.Sleep(300 * time.Millisecond)
		js.Publish(ctx, "p.x", []byte("before"))
		if s := <-got; s != "before" {
			t.Fatal(s)
		}
		if quiet {
			time.Sleep(pull.Quiet + 200*time.Millisecond)
		}
		n.Restart()
		restarted := time.Now()
		testenv.Eventually(t, 10*time.Second, "reconnected", nc.IsConnected)
		deadline := time.After(20 * time.Second)
		tick := time.NewTicker(200 * time.Millisecond)
	wait:
		for {
			select {
			case s := <-got:
				t.Logf("quiet %v: %q %v after the restart", quiet, s, time.Since(restarted).Round(time.Millisecond))
				break wait
			case err := <-errc:
				t.Fatalf("quiet %v: %v", quiet, err)
			case <-tick.C:
				js.Publish(ctx, "p.x", []byte("after"))
			case <-deadline:
				t.Fatalf("quiet %v: nothing 20 s after the restart", quiet)
			}
		}
		tick.Stop()
		raw.Stop()
	}
}
