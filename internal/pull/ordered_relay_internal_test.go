package pull

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/internal/testenv"
)

// relay is a LossyJetStream on a server of its own with stream S on s.>.
func relay(t *testing.T, lose func(api string, nth int) bool, opts ...jetstream.JetStreamOpt) *relayed {
	t.Helper()
	r := &relayed{testenv.LoseJetStreamAnswers(t, testenv.StartNATS(t).Connect(), lose, opts...)}
	if _, err := r.Direct.CreateStream(context.Background(), jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	return r
}

type relayed struct{ *testenv.LossyJetStream }

func (r *relayed) creates() int { return r.Asked("CONSUMER.CREATE.") }

// consumers is what the server holds on S: name → inactive threshold.
func (r *relayed) consumers(t *testing.T) map[string]time.Duration {
	t.Helper()
	out := map[string]time.Duration{}
	s, err := r.Direct.Stream(context.Background(), "S")
	if err != nil {
		t.Fatal(err)
	}
	l := s.ListConsumers(context.Background())
	for ci := range l.Info() {
		out[ci.Name] = ci.Config.InactiveThreshold
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAnUnansweredCreateWithoutADeadlineEndsAsJetStreamsOwnDoes: a caller
// that set no deadline (the operator's commands run on the signal context;
// an agent's context.Background()) got an error from js.OrderedConsumer
// once JetStream's default timeout passed; OrderedConsumer, which asks
// again until ctx ends, must not turn that into a wait without end.
func TestAnUnansweredCreateWithoutADeadlineEndsAsJetStreamsOwnDoes(t *testing.T) {
	defer jsretry.SetPatience(100 * time.Millisecond)()
	js := relay(t, func(api string, _ int) bool { return api == "CONSUMER.CREATE" }, jetstream.WithDefaultTimeout(300*time.Millisecond))

	began := time.Now()
	_, err := js.JetStream.OrderedConsumer(context.Background(), "S", jetstream.OrderedConsumerConfig{})
	t.Logf("js.OrderedConsumer without a deadline: %v after %v", err, time.Since(began).Round(time.Millisecond))

	ctx, cancel := context.WithCancel(context.Background()) // no deadline; cancelled only to end the test
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := OrderedConsumer(ctx, js, "S", jetstream.OrderedConsumerConfig{})
		done <- err
	}()
	select {
	case err := <-done:
		t.Logf("OrderedConsumer: %v", err)
	case <-time.After(3 * time.Second):
		cancel()
		<-done
		t.Fatalf("OrderedConsumer without a deadline still asking after 3s: %d create requests, %d consumers left on the server",
			js.creates(), len(js.consumers(t)))
	}
}

// TestACreateAskedAgainLeavesOneConsumer: a create whose answer was lost
// is asked again; the consumer the first request made must not be left on
// the server beside the one the caller reads (each is an R1 memory
// consumer the server keeps for its InactiveThreshold).
func TestACreateAskedAgainLeavesOneConsumer(t *testing.T) {
	defer jsretry.SetPatience(200 * time.Millisecond)()
	js := relay(t, func(api string, nth int) bool { return api == "CONSUMER.CREATE" && nth == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	cons, err := OrderedConsumer(ctx, js, "S", jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		t.Fatal(err)
	}
	mine := cons.CachedInfo().Name
	var left []string
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left = left[:0]
		for name, idle := range js.consumers(t) {
			if name != mine {
				left = append(left, name+" (removed after "+idle.String()+" idle)")
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d create requests the caller reads %s, and the server also keeps %v", js.creates(), mine, left)
		}
	}
}

// TestOrderedConsumerOnAClosedOrDrainingConnectionReturnsAtOnce: the
// errors nats.go gives at once on a connection that cannot ask (closed,
// draining) are not taken for an unanswered request and asked again.
func TestOrderedConsumerOnAClosedOrDrainingConnectionReturnsAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, how := range []string{"closed", "draining"} {
		n := testenv.StartNATS(t)
		nc := n.Connect()
		js, _ := jetstream.New(nc)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
			t.Fatal(err)
		}
		if how == "closed" {
			nc.Close()
		} else {
			sub, _ := nc.Subscribe("busy", func(*nats.Msg) { time.Sleep(2 * time.Second) })
			nc.Publish("busy", nil)
			nc.Flush()
			_ = sub
			nc.Drain()
		}
		began := time.Now()
		_, err := OrderedConsumer(ctx, js, "S", jetstream.OrderedConsumerConfig{})
		t.Logf("%s: %v after %v", how, err, time.Since(began))
		if time.Since(began) > time.Second {
			t.Fatalf("%s: %v after %v", how, err, time.Since(began))
		}
	}
}

type counting struct {
	jetstream.JetStream
	mu    sync.Mutex
	calls int
}

func (c *counting) OrderedConsumer(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	return c.JetStream.OrderedConsumer(ctx, stream, cfg)
}

// streamOfAStoppedServer is a server with stream S on s.>, shut down, and a
// connection to it (opts its options) waiting to reconnect.
func streamOfAStoppedServer(t *testing.T, opts ...nats.Option) (*testenv.NATS, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	n := testenv.StartNATS(t)
	nc := n.Connect(opts...)
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	n.Shutdown()
	return n, nc, js
}

// TestOrderedConsumerWhileReconnectingAsksOncePerTimeout: with the server
// down (the request buffered for the reconnect, or refused with the
// buffer off) the asking is paced by the request timeout, not a hot loop.
func TestOrderedConsumerWhileReconnectingAsksOncePerTimeout(t *testing.T) {
	defer jsretry.SetPatience(100 * time.Millisecond)()
	for _, buf := range []int{8 << 20, -1} {
		_, _, js := streamOfAStoppedServer(t, nats.ReconnectBufSize(buf))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c := &counting{JetStream: js}
		_, err := OrderedConsumer(ctx, c, "S", jetstream.OrderedConsumerConfig{})
		cancel()
		t.Logf("reconnect buffer %d: %v after %d requests", buf, err, c.calls)
		if c.calls > 20 {
			t.Fatalf("reconnect buffer %d: %d requests in 1s", buf, c.calls)
		}
	}
}

// TestCreatesAskedDuringAnOutageLeaveNoConsumersBehind: the requests asked
// while the server was down wait in the connection's reconnect buffer and
// reach the server when it is back, each creating a consumer nobody reads.
func TestCreatesAskedDuringAnOutageLeaveNoConsumersBehind(t *testing.T) {
	defer jsretry.SetPatience(100 * time.Millisecond)()
	n, nc, js := streamOfAStoppedServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	c := &counting{JetStream: js}
	_, err := OrderedConsumer(ctx, c, "S", jetstream.OrderedConsumerConfig{})
	cancel()
	n.Restart()
	testenv.Eventually(t, 10*time.Second, "reconnected", nc.IsConnected)
	nc.Flush()
	time.Sleep(500 * time.Millisecond) // the buffered requests are answered
	s, err2 := js.Stream(context.Background(), "S")
	if err2 != nil {
		t.Fatal(err2)
	}
	var names []string
	for name := range s.ConsumerNames(context.Background()).Name() {
		names = append(names, name)
	}
	if len(names) > 1 {
		t.Fatalf("%d requests asked while the server was down (%v): %d consumers on the server after it came back, none read: %v",
			c.calls, err, len(names), names)
	}
}
