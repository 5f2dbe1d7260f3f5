package worker

import (
	"fmt"
	"sync"
)

// deliveryLimit is the bookkeeping of the delivery limit (MaxDeliver): which
// try of a job counts, and against what. A job that reaches the limit goes
// to the DLQ with what the ledger knew of it. The rules, all of them:
//
//	the delivery…                                   spends          counted against, and at the limit
//	is answered or dead-lettered                     nothing         its hand-backs are forgotten
//	failed for a fault of its own (retryAfter),      a try           the row's failures (verdict.tries): DLQ at max
//	  a call with a ledger row: the downstream
//	  refused it, a keyed write's outcome was
//	  uncertain, its holder died mid-call
//	failed for a fault of its own, no ledger row     a delivery      JetStream's deliveries less this process's
//	                                                                 uncounted hand-backs: DLQ at max
//	waited on another attempt, rode out an outage,   nothing         an uncounted hand-back, remembered by the
//	  was held back by an open breaker or the drain,                 job's stream sequence
//	  lost a takeover race (retryUncounted)
//	arrives, no ledger row, delivered more than      —               DLQ on arrival: its worker died every time,
//	  crashLoop × max times                                          so no delivery ever reached settle
//
// A call's failures restart at 0 when it reaches the limit, so that a
// requeue of its dead letter gets a full set of tries.
type deliveryLimit struct {
	max       int
	handBacks handBacks
}

// crashLoop × max deliveries dead-letter a job of a tool without a ledger
// row on arrival.
const crashLoop = 3

// deliveries is how many deliveries of the message at stream sequence seq
// count: JetStream's count less this process's uncounted hand-backs.
func (l *deliveryLimit) deliveries(seq uint64, delivered int) int {
	return delivered - l.handBacks.get(seq)
}

// reached is, for a verdict that hands the job back, why the job has used
// up its tries, or nil while it has not; deliveries is deliveries() of its
// message.
func (l *deliveryLimit) reached(v verdict, deliveries int) error {
	switch {
	case v.verb != verbNak || !v.spends:
		return nil
	case v.tries > 0 && v.tries >= int64(l.max):
		return fmt.Errorf("still unsettled after %d tries: %w", v.tries, v.err)
	case v.tries == 0 && deliveries >= l.max:
		return fmt.Errorf("still unsettled after %d deliveries: %w", deliveries, v.err)
	}
	return nil
}

// crashLooping is why a job of a tool without a ledger row, delivered so
// often that its worker must have died every time, stops now, or nil.
func (l *deliveryLimit) crashLooping(deliveries int) error {
	if deliveries <= crashLoop*l.max {
		return nil
	}
	return fmt.Errorf("delivered %d times (more than %d × the limit of %d) without settling: a job that keeps stopping its worker", deliveries, crashLoop, l.max)
}

// failure is a call's next failed try: the try it is (1, 2, …), and the
// failures to record on its row, 0 once it reaches the limit.
func (l *deliveryLimit) failure(failures int64) (try, record int64) {
	try = failures + 1
	if try >= int64(l.max) {
		return try, 0
	}
	return try, try
}

// exhausts reports whether a call's try uses up its tries.
func (l *deliveryLimit) exhausts(try int64) bool { return try >= int64(l.max) }

// ended records how a delivery of the message at seq was handed on: an
// uncounted hand-back is remembered; an answer or a dead letter forgets
// the message.
func (l *deliveryLimit) ended(seq uint64, v verdict) {
	switch {
	case v.verb == verbNak && !v.spends:
		l.handBacks.add(seq)
	case v.verb != verbNak:
		l.handBacks.forget(seq)
	}
}

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
