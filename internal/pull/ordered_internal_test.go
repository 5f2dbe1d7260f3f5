package pull

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// unanswering is a JetStream whose first `unanswered` requests to create an
// ordered consumer go unanswered (they wait for their context), as in a
// cluster that has just lost a node, and whose next one succeeds or fails
// with err.
type unanswering struct {
	jetstream.JetStream
	unanswered int
	err        error
	calls      int
}

type createdConsumer struct{ jetstream.Consumer }

func (u *unanswering) OrderedConsumer(ctx context.Context, _ string, _ jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	u.calls++
	if u.calls <= u.unanswered {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if u.err != nil {
		return nil, u.err
	}
	return createdConsumer{}, nil
}

// TestAnUnansweredConsumerCreateIsAskedAgain: a request to create an
// ordered consumer that goes unanswered is asked again after the timeout of
// one request, and the caller gets the consumer the next one creates, well
// before its own deadline; an answer that is an error comes back at once,
// and so does the caller's own deadline.
func TestAnUnansweredConsumerCreateIsAskedAgain(t *testing.T) {
	defer func(d time.Duration) { createTimeout = d }(createTimeout)
	createTimeout = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	js := &unanswering{unanswered: 2}
	began := time.Now()
	cons, err := OrderedConsumer(ctx, js, "S", jetstream.OrderedConsumerConfig{})
	if err != nil || cons == nil || js.calls != 3 || time.Since(began) > 5*time.Second {
		t.Fatalf("after 2 unanswered requests: %v %v, %d requests in %v; want the third's consumer", cons, err, js.calls, time.Since(began))
	}

	refused := errors.New("stream not found")
	js = &unanswering{err: refused}
	if _, err := OrderedConsumer(ctx, js, "S", jetstream.OrderedConsumerConfig{}); !errors.Is(err, refused) || js.calls != 1 {
		t.Fatalf("an answer that is an error: %v after %d requests, want it at once", err, js.calls)
	}

	short, cancelShort := context.WithTimeout(ctx, 120*time.Millisecond)
	defer cancelShort()
	js = &unanswering{unanswered: 1000}
	if _, err := OrderedConsumer(short, js, "S", jetstream.OrderedConsumerConfig{}); !errors.Is(err, context.DeadlineExceeded) || short.Err() == nil {
		t.Fatalf("the caller's deadline: %v, want it to end the asking", err)
	}
}
