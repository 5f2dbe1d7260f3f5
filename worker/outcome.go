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

// verdict is how one delivery ends: what to tell JetStream and how to
// count it (see deliveryLimit). settle is the one place that acts on it.
type verdict struct {
	label Outcome
	verb  verb
	delay time.Duration // verbNak: when to deliver again
	// spends (verbNak): this delivery failed for a fault of its own and
	// spends a try of the delivery limit. Waits on another attempt and
	// outages do not.
	spends bool
	// tries (verbNak, spends): how many times the call has failed, from its
	// ledger row; 0 for a tool without a row, whose deliveries count
	// instead.
	tries  int64
	reason string // verbDeadLetter: the DLQ reason (jobs.DLQ*)
	err    error  // verbNak and verbDeadLetter: why
}

// answered acks a delivery whose result is published.
func answered(label Outcome) verdict { return verdict{label: label, verb: verbAck} }

// retryAfter hands the job back after delay; the delivery counts toward
// MaxDeliver.
func retryAfter(delay time.Duration, err error) verdict {
	return verdict{label: OutcomeRetry, verb: verbNak, delay: delay, spends: true, err: orRetry(err)}
}

// retryUncounted hands the job back without spending a delivery: the ledger
// or the broker was out, or the job waits on another attempt of its call.
func retryUncounted(delay time.Duration, err error) verdict {
	return verdict{label: OutcomeRetry, verb: verbNak, delay: delay, err: orRetry(err)}
}

// deadLettered sends the message to the DLQ with reason.
func deadLettered(reason string, err error) verdict {
	return verdict{label: OutcomeDeadLetter, verb: verbDeadLetter, reason: reason, err: err}
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
func (w *Worker) settle(ctx context.Context, d *delivery, o verdict) {
	if why := w.limit.reached(o, d.countedDeliveries()); why != nil {
		o = deadLettered(jobs.DLQMaxDeliver, why)
	}
	if o.verb == verbDeadLetter {
		err := w.publishDeadLetter(ctx, d, o)
		if err == nil && d.decided() { // the run of an approved call: its waiters hold a pending answer
			d.answerDeadLettered(o)
		}
		if err != nil {
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
		w.limit.ended(d.meta.Sequence.Stream, o)
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
