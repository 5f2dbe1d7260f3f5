package worker

import (
	"fmt"
	"sync"
	"time"
)

// retryError asks for the job to come back after a delay (NakWithDelay).
type retryError struct {
	after     time.Duration
	err       error
	uncounted bool // an outage, or a wait on another attempt: it does not count toward the DLQ
}

func (e *retryError) Error() string { return fmt.Sprintf("retry in %s: %v", e.after, e.err) }
func (e *retryError) Unwrap() error { return e.err }

func retryLater(after time.Duration, err error) error {
	if err == nil {
		err = fmt.Errorf("retry")
	}
	return &retryError{after: after, err: err}
}

// uncountedRetry asks for the job to come back without counting the
// delivery toward the dead-letter limit: the ledger or the broker was out, or
// the job waits on another attempt of its call.
func uncountedRetry(after time.Duration, err error) error {
	return &retryError{after: after, err: err, uncounted: true}
}

// deadLetterError sends the message to the DLQ and terminates it.
type deadLetterError struct {
	reason string
	err    error
}

func (e *deadLetterError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *deadLetterError) Unwrap() error { return e.err }

func deadLetter(reason string, err error) error { return &deadLetterError{reason: reason, err: err} }

// rejectError answers a valid job that cannot run with a rejected result.
type rejectError struct {
	code, message string
}

func (e *rejectError) Error() string { return e.code + ": " + e.message }

func (w *Worker) reject(_ *delivery, code, message string) error {
	return &rejectError{code: code, message: message}
}

// Stats counts what the worker did, by outcome: ok, error, rejected,
// indeterminate (results published for calls that ran or were refused),
// duplicate (answered from the ledger), retry, dead_letter, fenced.
type Stats struct {
	mu     sync.Mutex
	counts map[string]int64
}

func (s *Stats) add(outcome string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts == nil {
		s.counts = map[string]int64{}
	}
	s.counts[outcome]++
}

// Snapshot returns the counts so far.
func (s *Stats) Snapshot() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int64, len(s.counts))
	for k, v := range s.counts {
		out[k] = v
	}
	return out
}

// Stats returns the worker's counters.
func (w *Worker) Stats() *Stats { return &w.stats }
