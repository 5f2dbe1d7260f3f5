package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

func (b Breaker) withDefaults() Breaker {
	if b.Failures == 0 {
		b.Failures = DefaultFailures
	}
	if b.OpenFor == 0 {
		b.OpenFor = DefaultOpenFor
	}
	if b.HalfOpen == 0 {
		b.HalfOpen = 1
	}
	return b
}

// breaker wraps a gobreaker circuit breaker for one downstream. Not-sent and
// ambiguous failures count against it; definite failures (the downstream
// answered) count as successes, and cancellations and transaction
// conflicts (see sqlRetried) are not counted.
type breaker struct {
	cb       *gobreaker.CircuitBreaker[json.RawMessage]
	settings Breaker

	// openedAt is when the breaker last opened, in Unix nanoseconds. It is
	// written by OnStateChange, which gobreaker calls with its own mutex
	// held, so it must not take a lock that is held while calling into
	// gobreaker: an atomic takes none.
	openedAt atomic.Int64
}

func newBreaker(name string, s Breaker, logger *slog.Logger) *breaker {
	if logger == nil {
		logger = slog.Default()
	}
	b := &breaker{settings: s}
	b.cb = gobreaker.NewCircuitBreaker[json.RawMessage](gobreaker.Settings{
		Name:        name,
		MaxRequests: s.HalfOpen,
		Timeout:     s.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= s.Failures },
		IsSuccessful: func(err error) bool {
			outcome, _ := Classify(err)
			return outcome == Success || outcome == Definite
		},
		IsExcluded: func(err error) bool {
			if err == nil {
				return false
			}
			var te *Error
			// Cancelled calls say nothing of the downstream; neither does a
			// transaction rolled back for contention (a serialization
			// failure, a deadlock, a lock timeout), which goes through
			// retried.
			return errors.As(err, &te) && (te.Code == CodeCancelled || sqlContention(te.Code))
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				b.openedAt.Store(time.Now().UnixNano())
			}
			level := slog.LevelInfo
			if to == gobreaker.StateOpen {
				level = slog.LevelWarn
			}
			logger.Log(context.Background(), level, "circuit breaker state changed", "downstream", name, "from", from.String(), "to", to.String())
		},
	})
	return b
}

func (b *breaker) run(call func() (json.RawMessage, error)) (json.RawMessage, error) {
	out, err := b.cb.Execute(call)
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		return nil, NotSentError(CodeBreakerOpen, fmt.Sprintf("circuit breaker for %s is %s", b.cb.Name(), b.cb.State()), b.remaining(err), fmt.Errorf("%w: %w", ErrBreakerOpen, err))
	}
	return out, err
}

// ErrBreakerOpen is under the NotSent error of a call that the downstream's
// circuit breaker refused: no call was made, and the failures of other
// calls, not this one's, opened it.
var ErrBreakerOpen = errors.New("tools: circuit breaker open")

// remaining is when a call that the breaker refused should come back. Open
// (gobreaker.ErrOpenState): when the open period ends. Half-open with its
// trial calls taken (gobreaker.ErrTooManyRequests): a whole open period,
// since a failing trial opens it again for that long, and a succeeding one
// lets the calls through then anyway.
//
// It reads gobreaker's answer and openedAt only, never the breaker's state:
// gobreaker calls OnStateChange with its mutex held, and openedAt was stored
// under that mutex before Execute refused the call.
func (b *breaker) remaining(refusal error) time.Duration {
	if errors.Is(refusal, gobreaker.ErrTooManyRequests) {
		return b.settings.OpenFor
	}
	openedAt := time.Unix(0, b.openedAt.Load())
	return max(b.settings.OpenFor-time.Since(openedAt), 10*time.Millisecond)
}

func (b *breaker) state() string { return b.cb.State().String() }

// wait is how long the breaker stays open, or 0 when it would let a call
// through now.
func (b *breaker) wait() time.Duration {
	if b.cb.State() != gobreaker.StateOpen {
		return 0
	}
	return b.remaining(gobreaker.ErrOpenState)
}
