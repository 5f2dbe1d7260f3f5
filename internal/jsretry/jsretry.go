// Package jsretry asks JetStream again when a request goes unanswered.
//
// nats.go waits for the answer to a JetStream request (a stream's info, a
// consumer's, a publish's PubAck) until the caller's context ends, or for
// its default timeout when the context has no deadline. In a cluster that
// has just lost a node, a request can go unanswered though the next one is
// answered at once: an agent awaiting its results, or an operator's replay,
// with a deadline of minutes waited all of them for nothing. Do asks again
// after Patience, for as long as the caller's deadline allows.
//
// Only requests that can be asked twice are asked through Do: reads, and
// publishes that carry a message id (JetStream takes the second as a
// duplicate of the first).
package jsretry

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// patience is how long one request waits for its answer before Do asks
// again, in nanoseconds.
var patience atomic.Int64

func init() { patience.Store(int64(5 * time.Second)) }

// Patience is how long one request waits for its answer before Do asks
// again: 5s, JetStream's own default timeout.
func Patience() time.Duration { return time.Duration(patience.Load()) }

// SetPatience sets Patience to d, for tests, and returns what restores it.
func SetPatience(d time.Duration) (restore func()) {
	was := patience.Swap(int64(d))
	return func() { patience.Store(was) }
}

// unavailablePause is how long Do waits before asking again a cluster that
// answered that JetStream is unavailable (it has no meta leader yet).
const unavailablePause = 250 * time.Millisecond

// Do calls ask, and calls it again whenever its answer did not come within
// Patience or the cluster answered that JetStream is for the moment
// unavailable, until ctx ends; it returns the first answer, or the last
// error. Without a deadline on ctx it calls ask once, and JetStream's
// default timeout bounds the wait, as without Do.
func Do[T any](ctx context.Context, ask func(context.Context) (T, error)) (T, error) {
	if _, ok := ctx.Deadline(); !ok {
		return ask(ctx)
	}
	for {
		attempt, cancel := context.WithTimeout(ctx, Patience())
		v, err := ask(attempt)
		cancel()
		if err == nil || ctx.Err() != nil {
			return v, err
		}
		switch {
		case unanswered(err):
		case errors.As(err, new(noStream)):
			return v, err
		case answeredWith(err, 10008, 10158), errors.Is(err, jetstream.ErrNoStreamResponse):
			select {
			case <-ctx.Done():
				return v, err
			case <-time.After(unavailablePause):
			}
		default:
			return v, err
		}
	}
}

// unanswered is an error that says the answer did not come in time.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// A publish that no stream took (jetstream.ErrNoStreamResponse: nobody
// listened on its subject, as while a stream's replicas elect a leader) did
// not reach a stream: it is asked again after the same pause, unless it is
// a noStream (see Publish).

// Publish is Do for a publish to stream. A publish that no stream took is
// asked again only while stream exists (its replicas electing a leader):
// when JetStream answers that there is no such stream (no consumer created
// the streams yet, a wrong NATS URL) the error is returned at once, still
// jetstream.ErrNoStreamResponse, rather than at the caller's deadline.
func Publish(ctx context.Context, js jetstream.JetStream, stream string, publish func(context.Context) (*jetstream.PubAck, error)) (*jetstream.PubAck, error) {
	return Do(ctx, func(ctx context.Context) (*jetstream.PubAck, error) {
		ack, err := publish(ctx)
		if !errors.Is(err, jetstream.ErrNoStreamResponse) {
			return ack, err
		}
		check, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, serr := js.Stream(check, stream); errors.Is(serr, jetstream.ErrStreamNotFound) || errors.Is(serr, jetstream.ErrJetStreamNotEnabled) {
			return ack, noStream{err}
		}
		return ack, err
	})
}

// noStream is a publish's jetstream.ErrNoStreamResponse when its stream
// does not exist: Do does not ask it again.
type noStream struct{ error }

func (e noStream) Unwrap() error { return e.error }

// answeredWith reports whether err is JetStream's answer with one of
// codes: 10008 (JSClusterNotAvailErr) while a cluster has no meta leader,
// 10158 (JSStreamDuplicateMessageConflict) to a publish asked again while
// the first, under the same message id, is still being replicated and may
// yet be stored.
func answeredWith(err error, codes ...jetstream.ErrorCode) bool {
	var api *jetstream.APIError
	if !errors.As(err, &api) {
		return false
	}
	for _, c := range codes {
		if api.ErrorCode == c {
			return true
		}
	}
	return false
}
