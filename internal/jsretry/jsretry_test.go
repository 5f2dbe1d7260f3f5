package jsretry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/internal/testenv"
)

// server answers the first `silent` requests with nothing (they wait for
// their context, as in a cluster that has just lost a node), then answers
// with `first` errors, then with answer.
type server struct {
	silent int
	first  []error
	calls  int
}

func (s *server) ask(ctx context.Context) (string, error) {
	s.calls++
	if s.calls <= s.silent {
		<-ctx.Done()
		return "", ctx.Err()
	}
	if n := s.calls - s.silent - 1; n < len(s.first) {
		return "", s.first[n]
	}
	return "answer", nil
}

// TestAnUnansweredRequestIsAskedAgainWithinTheCallersDeadline: two
// requests that go unanswered, then one answered: the caller gets the
// answer after two patiences, long before its own deadline.
func TestAnUnansweredRequestIsAskedAgainWithinTheCallersDeadline(t *testing.T) {
	defer jsretry.SetPatience(50 * time.Millisecond)()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := &server{silent: 2}
	began := time.Now()
	v, err := jsretry.Do(ctx, s.ask)
	if err != nil || v != "answer" || s.calls != 3 || time.Since(began) > 5*time.Second {
		t.Fatalf("%q %v after %d requests in %v; want the third's answer", v, err, s.calls, time.Since(began))
	}
}

// TestATimeoutFromNATSIsAskedAgain: nats.ErrTimeout (a request's own
// timer) counts as unanswered too.
func TestATimeoutFromNATSIsAskedAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := &server{first: []error{nats.ErrTimeout, nats.ErrTimeout}}
	if v, err := jsretry.Do(ctx, s.ask); err != nil || v != "answer" || s.calls != 3 {
		t.Fatalf("%q %v after %d requests", v, err, s.calls)
	}
}

// TestAClusterWithoutALeaderIsAskedAgainAfterAPause: JetStream's "system
// temporarily unavailable" (10008) is asked again, paced, not in a loop.
func TestAClusterWithoutALeaderIsAskedAgainAfterAPause(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unavailable := &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
	s := &server{first: []error{unavailable, unavailable}}
	began := time.Now()
	if v, err := jsretry.Do(ctx, s.ask); err != nil || v != "answer" || s.calls != 3 {
		t.Fatalf("%q %v after %d requests", v, err, s.calls)
	}
	if d := time.Since(began); d < 400*time.Millisecond {
		t.Fatalf("two unavailable answers asked again after %v: not paced", d)
	}
}

// TestAnAnswerThatIsAnErrorComesBackAtOnce: a refusal (a stream not found,
// a wrong sequence) is the answer; asking again would not change it.
func TestAnAnswerThatIsAnErrorComesBackAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, refusal := range []error{jetstream.ErrStreamNotFound, errors.New("wrong last sequence"), nats.ErrConnectionClosed} {
		s := &server{first: []error{refusal}}
		if _, err := jsretry.Do(ctx, s.ask); !errors.Is(err, refusal) || s.calls != 1 {
			t.Fatalf("%v after %d requests, want %v at once", err, s.calls, refusal)
		}
	}
}

// TestTheCallersDeadlineEndsTheAsking: a server that never answers is
// asked until the caller's deadline, which Do returns.
func TestTheCallersDeadlineEndsTheAsking(t *testing.T) {
	defer jsretry.SetPatience(30 * time.Millisecond)()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	s := &server{silent: 1 << 30}
	if _, err := jsretry.Do(ctx, s.ask); !errors.Is(err, context.DeadlineExceeded) || ctx.Err() == nil || s.calls < 3 {
		t.Fatalf("%v after %d requests, want the caller's deadline after several", err, s.calls)
	}
}

// TestWithoutADeadlineItAsksOnce: a caller that set no deadline gets what
// one request gives, bounded by JetStream's default timeout, never a wait
// without end.
func TestWithoutADeadlineItAsksOnce(t *testing.T) {
	s := &server{first: []error{nats.ErrTimeout}}
	if _, err := jsretry.Do(context.Background(), s.ask); !errors.Is(err, nats.ErrTimeout) || s.calls != 1 {
		t.Fatalf("%v after %d requests, want the one timeout", err, s.calls)
	}
}

// TestAPublishNoStreamTookIsAskedAgainAfterAPause: Do asks a publish with
// a message id that no stream listened for ("no response from stream", as
// while a stream's replicas elect a leader) again after a pause until a
// stream takes it (here one created a second later), and it is stored
// once. Publish asks again only while the stream exists (below).
func TestAPublishNoStreamTookIsAskedAgainAfterAPause(t *testing.T) {
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	time.AfterFunc(time.Second, func() {
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
			t.Error(err)
		}
	})
	ack, err := jsretry.Do(ctx, func(ctx context.Context) (*jetstream.PubAck, error) {
		return js.Publish(ctx, "s.job", []byte("x"), jetstream.WithMsgID("job-1"))
	})
	if err != nil {
		t.Fatalf("the publish before the stream was there: %v", err)
	}
	s, err := js.Stream(ctx, "S")
	if err != nil || ack.Sequence != 1 || s.CachedInfo().State.Msgs != 1 {
		t.Fatalf("stored at %d, the stream holds %+v (%v)", ack.Sequence, s.CachedInfo().State, err)
	}
}

// TestAPublishToAStreamThatDoesNotExistFailsAtOnce: a publish no stream
// takes because there is no stream at all (no consumer created the streams
// yet, a wrong NATS URL) is not asked again until the caller's deadline:
// its "no response from stream" comes back at once, to be explained.
func TestAPublishToAStreamThatDoesNotExistFailsAtOnce(t *testing.T) {
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := jsretry.Publish(ctx, js, "S", func(ctx context.Context) (*jetstream.PubAck, error) {
		return js.Publish(ctx, "s.job", []byte("x"), jetstream.WithMsgID("job-1"), jetstream.WithExpectStream("S"))
	})
	if !errors.Is(err, jetstream.ErrNoStreamResponse) || time.Since(start) > 2*time.Second {
		t.Fatalf("%v after %v, want no response from stream at once", err, time.Since(start))
	}
}

// TestAPublishNoStreamTookWhileItsStreamExistsIsAskedAgain: the stream
// exists but nobody took the publish (its replicas electing a leader): it is
// asked again, and stored once.
func TestAPublishNoStreamTookWhileItsStreamExistsIsAskedAgain(t *testing.T) {
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	calls := 0
	ack, err := jsretry.Publish(ctx, js, "S", func(ctx context.Context) (*jetstream.PubAck, error) {
		if calls++; calls <= 2 {
			return nil, jetstream.ErrNoStreamResponse // a leader being elected
		}
		return js.Publish(ctx, "s.job", []byte("x"), jetstream.WithMsgID("job-1"), jetstream.WithExpectStream("S"))
	})
	if err != nil || calls != 3 || ack.Sequence != 1 {
		t.Fatalf("%+v, %v after %d publishes", ack, err, calls)
	}
}
