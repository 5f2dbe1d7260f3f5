package pull_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/pull"
	"github.com/toolq/toolq/internal/testenv"
)

// lossy is a pull iterator with the library's flaw reduced to its core: a
// call sees only what was there when it began. A message that arrives while
// a call waits is left for the next call, so a caller that waits in one
// piece waits for good (a lost wake-up), and one that waits in slices gets
// the message at its next slice. A call with an option waits Recheck at
// most and then times out, as NextMaxWait does; one without waits until the
// iterator is stopped.
type lossy struct {
	jetstream.MessagesContext // unused methods panic

	mu      sync.Mutex
	queue   []jetstream.Msg
	timed   int // calls made with a wait
	untimed int // calls made without
	stopped chan struct{}
}

func newLossy() *lossy { return &lossy{stopped: make(chan struct{})} }

func (l *lossy) push(m jetstream.Msg) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queue = append(l.queue, m)
}

func (l *lossy) Next(opts ...jetstream.NextOpt) (jetstream.Msg, error) {
	l.mu.Lock()
	if len(opts) > 0 {
		l.timed++
	} else {
		l.untimed++
	}
	if len(l.queue) > 0 {
		m := l.queue[0]
		l.queue = l.queue[1:]
		l.mu.Unlock()
		return m, nil
	}
	l.mu.Unlock()
	var timeout <-chan time.Time
	if len(opts) > 0 {
		timeout = time.After(pull.Recheck)
	}
	select {
	case <-timeout:
		return nil, nats.ErrTimeout
	case <-l.stopped:
		return nil, jetstream.ErrMsgIteratorClosed
	}
}

func (l *lossy) Stop() { close(l.stopped) }

func (l *lossy) calls() (timed, untimed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.timed, l.untimed
}

type msg struct{ jetstream.Msg }

// TestAMessageThatCameDuringAWaitIsNotLeftBehind: while messages flow, a
// message that arrived during a wait is returned at the next slice; the
// timeouts of the slices never reach the caller.
func TestAMessageThatCameDuringAWaitIsNotLeftBehind(t *testing.T) {
	l := newLossy()
	t.Cleanup(l.Stop)
	it := pull.New(l, nil)
	first := msg{}
	l.push(first)
	if got, err := it.Next(); err != nil || got != first {
		t.Fatalf("first: %v, %v", got, err)
	}
	got := make(chan jetstream.Msg, 1)
	go func() {
		m, err := it.Next()
		if err != nil {
			t.Errorf("Next: %v", err)
		}
		got <- m
	}()
	time.Sleep(3 * pull.Recheck) // Next is waiting (its slices time out meanwhile)
	second := &msg{}
	l.push(second)
	select {
	case m := <-got:
		if m != second {
			t.Fatalf("got %v, want the second message", m)
		}
	case <-time.After(10 * time.Second): // a lost wake-up waits for good
		t.Fatal("the message that came while Next waited was never returned")
	}
	if timed, untimed := l.calls(); untimed != 0 || timed < 3 {
		t.Fatalf("calls while messages flow: %d with a wait, %d without; want every one with a wait", timed, untimed)
	}
}

// TestAQuietIteratorWaitsInOnePiece: once nothing has come for Quiet, Next
// waits without a slice, so that the iterator watches the server's
// heartbeats (a pull request the server lost is noticed and made again).
func TestAQuietIteratorWaitsInOnePiece(t *testing.T) {
	l := newLossy()
	it := pull.New(l, nil)
	done := make(chan error, 1)
	go func() {
		_, err := it.Next()
		done <- err
	}()
	testenv.Eventually(t, 10*time.Second, "a wait without a slice", func() bool {
		_, untimed := l.calls()
		return untimed == 1
	})
	timed, _ := l.calls()
	time.Sleep(3 * pull.Recheck)
	if now, _ := l.calls(); now != timed {
		t.Fatalf("%d more sliced waits after the quiet period; want one wait in one piece", now-timed)
	}
	l.Stop()
	if err := <-done; !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
		t.Fatalf("after Stop: %v, want ErrMsgIteratorClosed", err)
	}
}

// TestIterOnJetStream: on a real server, a backlog comes through in order,
// a message published after a quiet period is returned, and a drain hands
// back what is buffered and then ends with ErrMsgIteratorClosed.
func TestIterOnJetStream(t *testing.T) {
	n := testenv.StartNATS(t)
	nc := n.Connect()
	js, ctx := stream(t, nc)
	const backlog = 500
	for i := range backlog {
		if _, err := js.Publish(ctx, "p.x", fmt.Appendf(nil, "%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	_, raw := pulling(t, js, ctx, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 64})
	it := pull.New(raw, nc)
	for i := range backlog {
		m, err := it.Next()
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if string(m.Data()) != fmt.Sprint(i) {
			t.Fatalf("message %d is %q", i, m.Data())
		}
		m.Ack()
	}
	time.Sleep(pull.Quiet + 200*time.Millisecond)
	go func() {
		time.Sleep(200 * time.Millisecond)
		js.Publish(ctx, "p.x", []byte("after"))
	}()
	if m, err := it.Next(); err != nil || string(m.Data()) != "after" {
		t.Fatalf("after the quiet period: %v, %v", m, err)
	}
	it.Drain()
	for {
		_, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			break
		}
		if err != nil {
			t.Fatalf("draining: %v", err)
		}
	}
}

// stream makes the stream P (subjects p.>) on nc's server.
func stream(t *testing.T, nc *nats.Conn) (jetstream.JetStream, context.Context) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "P", Subjects: []string{"p.>"}}); err != nil {
		t.Fatal(err)
	}
	return js, ctx
}

// pulling makes the consumer cfg on the stream P and pulls from it in
// batches of 16, with requests that expire after 2 s (heartbeat 1 s).
func pulling(t *testing.T, js jetstream.JetStream, ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, jetstream.MessagesContext) {
	t.Helper()
	cons, err := js.CreateOrUpdateConsumer(ctx, "P", cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cons.Messages(jetstream.PullMaxMessages(16), jetstream.PullExpiry(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return cons, raw
}
