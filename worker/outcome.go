package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/toolq/toolq/jobs"
)

// Outcome names how one delivery ended. It labels the toolq.jobs metric
// (attribute toolq.outcome) and the counts of Stats; each delivery has
// exactly one.
type Outcome string

// The outcomes. The first four publish a result for a call that ran or was
// refused; duplicate publishes the ledger's result of a call another
// delivery ran; the last three publish nothing for this delivery.
const (
	OutcomeOK            Outcome = "ok"            // the tool succeeded
	OutcomeError         Outcome = "error"         // the downstream answered no: a definite failure
	OutcomeRejected      Outcome = "rejected"      // a valid job that cannot run (unknown tool, bad args, key mismatch or collision)
	OutcomeIndeterminate Outcome = "indeterminate" // an unkeyed write whose effect is unknown: an operator resolves it
	OutcomeDuplicate     Outcome = "duplicate"     // answered from the ledger: nothing ran
	OutcomeRetry         Outcome = "retry"         // handed back to JetStream for a later delivery
	OutcomeFenced        Outcome = "fenced"        // lost its claim while the tool ran: published nothing, handed back
	OutcomeDeadLetter    Outcome = "dead_letter"   // sent to TOOLQ_DLQ and terminated
)

// verb is what JetStream is told about a delivery.
type verb int

const (
	verbAck        verb = iota // Ack: the result is published
	verbNak                    // NakWithDelay: deliver again later
	verbDeadLetter             // publish to TOOLQ_DLQ, then Term
)

func (v verb) String() string {
	return [...]string{"ack", "nak", "dead_letter"}[v]
}

// outcome is the verdict of one delivery: what to tell JetStream and how to
// count it. settle is the one place that acts on it.
type outcome struct {
	label Outcome
	verb  verb
	delay time.Duration // verbNak: when to deliver again
	// counted (verbNak): this delivery failed and counts toward
	// MaxDeliver. Waits on another attempt and outages do not.
	counted bool
	// tries (verbNak, counted): how many times the call has been tried,
	// from its ledger row's attempt; 0 for a tool without a row, whose
	// deliveries count instead.
	tries  int64
	reason string // verbDeadLetter: the DLQ reason (jobs.DLQ*)
	err    error  // verbNak and verbDeadLetter: why
}

// answered acks a delivery whose result is published.
func answered(label Outcome) outcome { return outcome{label: label, verb: verbAck} }

// retryAfter hands the job back after delay; the delivery counts toward
// MaxDeliver.
func retryAfter(delay time.Duration, err error) outcome {
	return outcome{label: OutcomeRetry, verb: verbNak, delay: delay, counted: true, err: orRetry(err)}
}

// retryUncounted hands the job back without spending a delivery: the ledger
// or the broker was out, or the job waits on another attempt of its call.
func retryUncounted(delay time.Duration, err error) outcome {
	return outcome{label: OutcomeRetry, verb: verbNak, delay: delay, err: orRetry(err)}
}

// deadLettered sends the message to the DLQ with reason.
func deadLettered(reason string, err error) outcome {
	return outcome{label: OutcomeDeadLetter, verb: verbDeadLetter, reason: reason, err: err}
}

func orRetry(err error) error {
	if err == nil {
		return errors.New("retry")
	}
	return err
}

// settle tells JetStream how the delivery ended, and is the only place that
// does: Ack for a published result; NakWithDelay for a retry, or the DLQ
// once a counted retry reaches the delivery limit (the call's tries, for a
// call with a ledger row: deliveries that waited or rode out an outage do
// not count); publish to the DLQ then
// Term for a dead letter, or NakWithDelay when the dead letter cannot be
// published (never dropped). It then counts the outcome and ends the
// delivery's span, once.
func (w *Worker) settle(ctx context.Context, d *delivery, o outcome) {
	if o.verb == verbNak && o.counted && o.tries > 0 && o.tries >= int64(w.limit) {
		o = deadLettered(jobs.DLQMaxDeliver, fmt.Errorf("still unsettled after %d tries: %w", o.tries, o.err))
	}
	if o.verb == verbNak && o.counted && o.tries == 0 && d.counted() >= w.limit {
		o = deadLettered(jobs.DLQMaxDeliver, fmt.Errorf("still unsettled after %d deliveries: %w", d.counted(), o.err))
	}
	if o.verb == verbDeadLetter {
		if err := w.publishDeadLetter(ctx, d, o); err != nil {
			if deadLetterRefused(err) {
				// Not a message it carried: the DLQ's limits or permissions,
				// which only an operator changes. Dropping the job would lose
				// it; it waits in TOOLQ_JOBS, counted and logged, instead.
				w.countRefusedDeadLetter(o.reason)
				w.log.ErrorContext(d.ctx, "TOOLQ_DLQ refused the dead letter even with toolq's headers alone; the job stays in TOOLQ_JOBS and is delivered again until the DLQ takes it: check the DLQ stream's limits and permissions", d.attrs("dlq_reason", o.reason, "error", err)...)
			} else {
				w.log.ErrorContext(d.ctx, "dead letter not published; the job will be redelivered", d.attrs("error", err)...)
			}
			o = retryUncounted(w.backoff(d), fmt.Errorf("dead letter not published: %w", err))
		}
	}
	var err error
	switch o.verb {
	case verbAck:
		d.hook(BeforeAck)
		err = d.msg.Ack()
	case verbNak:
		w.log.InfoContext(d.ctx, "job retried later", d.attrs("delay", o.delay, "reason", o.err.Error())...)
		err = d.msg.NakWithDelay(o.delay)
	case verbDeadLetter:
		w.log.WarnContext(d.ctx, "job dead-lettered", d.attrs("reason", o.reason, "detail", o.err.Error())...)
		err = d.msg.TermWithReason(o.reason)
	}
	if d.meta != nil {
		if o.verb == verbNak && !o.counted {
			w.uncounted.add(d.meta.Sequence.Stream)
		} else if o.verb != verbNak {
			w.uncounted.forget(d.meta.Sequence.Stream)
		}
	}
	if err != nil {
		// Not fatal: without an answer JetStream delivers the job again
		// after the ack wait, and the ledger answers it.
		w.log.WarnContext(d.ctx, "answering JetStream failed; the job will be redelivered", d.attrs("verb", o.verb.String(), "error", err)...)
	}
	w.record(d, o)
}

// Stats counts what the worker did, by Outcome.
type Stats struct {
	mu     sync.Mutex
	counts map[string]int64
}

func (s *Stats) add(o Outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts == nil {
		s.counts = map[string]int64{}
	}
	s.counts[string(o)]++
}

// Snapshot returns the counts so far, keyed by Outcome.
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

// handBacks counts, per stream sequence, the deliveries this process handed
// back without counting them, for the tools whose deliveries are their count
// (no ledger row). Bounded: past maxHandBacks sequences it starts again,
// which only ever counts more, never less.
type handBacks struct {
	mu sync.Mutex
	n  map[uint64]int
}

const maxHandBacks = 1 << 16

func (h *handBacks) add(seq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil || len(h.n) >= maxHandBacks {
		h.n = map[uint64]int{}
	}
	h.n[seq]++
}

func (h *handBacks) get(seq uint64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[seq]
}

func (h *handBacks) forget(seq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.n, seq)
}
