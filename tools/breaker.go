package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
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
// answered) count as successes, and cancellations are not counted.
type breaker struct {
	cb       *gobreaker.CircuitBreaker[json.RawMessage]
	settings Breaker

	mu       sync.Mutex
	openedAt time.Time
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
			var te *Error
			return errors.As(err, &te) && te.Code == "cancelled"
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				b.mu.Lock()
				b.openedAt = time.Now()
				b.mu.Unlock()
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
		return nil, NotSentError("breaker_open", fmt.Sprintf("circuit breaker for %s is %s", b.cb.Name(), b.cb.State()), b.remaining(), err)
	}
	return out, err
}

// remaining is how long the breaker stays open; while it is half-open with
// its trial calls taken, a short pause.
func (b *breaker) remaining() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cb.State() != gobreaker.StateOpen {
		return 100 * time.Millisecond
	}
	return max(b.settings.OpenFor-time.Since(b.openedAt), 10*time.Millisecond)
}

func (b *breaker) state() string { return b.cb.State().String() }
