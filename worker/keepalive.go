package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/toolq/toolq/ledger"
)

// durably runs op until it succeeds, fails for a reason other than an
// outage of the ledger or the broker, or ctx ends. While it waits it tells
// JetStream the job is in progress, so that an outage costs it no delivery
// (and so never sends it to the DLQ).
func (d *delivery) durably(ctx context.Context, what string, op func() error) error {
	delay := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		began := time.Now()
		err := op()
		if err == nil || !transient(err) {
			if attempt > 0 && err == nil {
				d.w.log.InfoContext(d.ctx, what+" succeeded after an outage", d.attrs("retries", attempt)...)
			}
			return err
		}
		if attempt == 0 {
			d.w.log.WarnContext(d.ctx, what+" failed; retrying until the outage ends", d.attrs("error", err)...)
		}
		d.msg.InProgress()
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			d.countOutage(what, time.Since(began))
			return err
		case <-t.C:
		}
		d.countOutage(what, time.Since(began))
		delay = min(delay*2, 5*time.Second, d.w.ackWait/3) // InProgress often enough to keep the delivery
	}
}

// brokerError marks a failure to reach JetStream.
type brokerError struct{ err error }

func (e *brokerError) Error() string { return "broker unreachable: " + e.err.Error() }
func (e *brokerError) Unwrap() error { return e.err }

// transient reports an outage of the ledger or the broker, as opposed to an
// answer about this job.
func transient(err error) bool {
	var be *brokerError
	return errors.Is(err, ledger.ErrUnavailable) || errors.As(err, &be)
}

// keepalive keeps a claim and its delivery alive while a call waits for
// its tool's concurrency slot and while it runs: it extends the lease and
// tells JetStream the job is in progress. A call may wait for a slot far
// longer than it may run, so the give-up clock (see beforeSend) starts only
// when the call does, and the call is sent only on a claim still held.
//
// Its beats and its give-up clock are timers: a call that ends before its
// first beat (most calls: a beat comes every third of a lease) costs no
// goroutine.
type keepalive struct {
	d     *delivery
	fence ledger.Fence  // zero for a tool without a ledger row
	every time.Duration // between the starts of two beats
	beats sync.WaitGroup

	mu        sync.Mutex
	heldUntil time.Time   // the lease is surely ours until then (monotonic)
	lost      error       // the ledger refused an extension: the claim is another's
	stopped   bool        // stop was called: no beat begins
	gaveUp    bool        // the call outlived its timeout: no beat begins
	beat      *time.Timer // the next beat
	giveUp    *time.Timer // started by beforeSend
}

// heartbeat starts keeping the delivery, and the claim behind fence, alive
// until stop is called. heldSince is when the request that set the claim's
// lease was sent (or earlier): the lease is ours until heldSince plus the
// lease at least. With a zero fence (a tool without a ledger row) it only
// keeps the delivery.
func (d *delivery) heartbeat(fence ledger.Fence, heldSince time.Time) *keepalive {
	k := &keepalive{d: d, fence: fence, heldUntil: heldSince.Add(d.tool.Lease),
		every: max(min(d.tool.Lease, d.w.ackWait)/3, 50*time.Millisecond)}
	k.mu.Lock() // the first beat finds k.beat set
	k.beat = time.AfterFunc(k.every, k.beatOnce)
	k.mu.Unlock()
	return k
}

// begin reports whether a beat, or the give-up, may run now; if so the
// caller calls k.beats.Done when it ends, and stop waits for it.
func (k *keepalive) begin() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped || k.gaveUp {
		return false
	}
	k.beats.Add(1)
	return true
}

// beatOnce extends the lease (for a claim) and tells JetStream the job is
// in progress, then sets the next beat one interval after this one began:
// a slow extension delays the next beat no further than that.
func (k *keepalive) beatOnce() {
	if !k.begin() {
		return
	}
	defer k.beats.Done()
	began := time.Now()
	if k.fence.Key != "" {
		if err := k.extend(); err != nil {
			k.d.w.log.WarnContext(k.d.ctx, "lease extension failed", k.d.attrs("error", err)...)
		}
	}
	k.d.msg.InProgress()
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.stopped && !k.gaveUp {
		k.beat.Reset(max(k.every-time.Since(began), 0))
	}
}

// giveUpNow stops the beats of a call that outlived its timeout.
//
// An executor that ignores its context can outlive its timeout: past the
// timeout and a grace period (half the timeout, at least a second) from the
// start of the call, the heartbeat stops, so that the lease and the
// delivery run out and the call is settled as a holder that stopped (taken
// over, or indeterminate), never kept alive forever. The wait for a slot
// does not count.
func (k *keepalive) giveUpNow() {
	if !k.begin() {
		return
	}
	defer k.beats.Done()
	k.d.w.log.ErrorContext(k.d.ctx, "the tool outlived its timeout; no longer keeping its claim and delivery alive", k.d.attrs("timeout", k.d.tool.Timeout)...)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.gaveUp = true
	k.beat.Stop()
}

// extend renews the lease, and records until when it is surely held, or
// that it is lost.
func (k *keepalive) extend() error {
	sent := time.Now()
	err := k.d.w.cfg.Ledger.Extend(k.d.runCtx, k.fence, k.d.tool.Lease)
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case err == nil:
		if until := sent.Add(k.d.tool.Lease); until.After(k.heldUntil) {
			k.heldUntil = until
		}
	case isFenced(err):
		k.lost = err
	}
	return err
}

// beforeSend runs once the call holds its slot, right before it is sent
// (tools.BeforeSend). It confirms that the claim is still held: when the
// last extension that succeeded leaves less than half a lease, it extends
// the lease now, riding out a ledger outage until the drain starts. A claim
// that is no longer held stops the call (ErrFenced or ErrNotFound). Then
// the give-up clock starts.
func (k *keepalive) beforeSend(context.Context) error {
	if k.fence.Key != "" {
		k.mu.Lock()
		until, lost := k.heldUntil, k.lost
		k.mu.Unlock()
		if lost != nil {
			return lost
		}
		if time.Until(until) < k.d.tool.Lease/2 {
			if err := k.d.durably(k.d.startCtx, "confirm the claim", k.extend); err != nil {
				return err
			}
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.giveUp == nil && !k.stopped {
		k.giveUp = time.AfterFunc(k.d.tool.Timeout+max(k.d.tool.Timeout/2, time.Second), k.giveUpNow)
	}
	return nil
}

// stop ends the heartbeat and waits for a beat under way. It may be called
// more than once.
func (k *keepalive) stop() {
	k.mu.Lock()
	k.stopped = true
	k.beat.Stop()
	if k.giveUp != nil {
		k.giveUp.Stop()
	}
	k.mu.Unlock()
	k.beats.Wait()
}

// awaitSettled polls the row while another attempt holds it, for up to
// Config.InFlightWait (less when the lease ends sooner), keeping this
// delivery alive with InProgress. It reports the row once that attempt has
// settled it.
func (d *delivery) awaitSettled(row ledger.Row) (ledger.Row, bool) {
	ctx := d.runCtx
	deadline := time.Now().Add(min(d.w.cfg.InFlightWait, row.LeaseRemaining))
	poll := 20 * time.Millisecond
	lastProgress := time.Now()
	for time.Now().Before(deadline) {
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return row, false
		case <-t.C:
		}
		poll = min(poll*2, 250*time.Millisecond)
		got, err := d.w.cfg.Ledger.Get(ctx, row.Key)
		switch {
		case err != nil: // released (not sent) or unreachable: let the next delivery look again
			return row, false
		case got.State != ledger.InFlight:
			return got, true
		case got.LeaseExpired() || got.Fence() != row.Fence():
			return row, false
		}
		if time.Since(lastProgress) > d.w.ackWait/3 {
			d.msg.InProgress()
			lastProgress = time.Now()
		}
	}
	return row, false
}

// takeoverOf takes over row's expired lease (a compare-and-set on its
// fence), under this delivery's token, riding out a ledger outage.
func (d *delivery) takeoverOf(row ledger.Row) (ledger.Row, error) {
	var taken ledger.Row
	d.leaseSince = time.Now()
	err := d.durably(d.runCtx, "takeover", func() (err error) {
		taken, err = d.w.cfg.Ledger.Takeover(d.runCtx, row.Fence(), d.w.cfg.Owner, d.token, d.tool.Lease)
		return err
	})
	if err == nil {
		d.w.held.Store(d.key, d)
	}
	return taken, err
}

// warnIdenticalCall logs a job that repeats an earlier call of the same turn
// (same tool and args, a higher ordinal): allowed, and usually a model error.
func (d *delivery) warnIdenticalCall() {
	if d.job.Ordinal == 0 {
		return
	}
	first := d.job.Call()
	first.Ordinal = 0
	key, err := first.Key()
	if err != nil {
		return
	}
	if row, err := d.w.cfg.Ledger.Get(d.runCtx, key); err == nil {
		d.w.log.WarnContext(d.ctx, "identical call repeated in one turn (ordinal > 0): running it, as asked; usually a model error",
			d.attrs("ordinal", d.job.Ordinal, "first_tool_use_id", row.FirstToolUseID, "conversation_id", d.job.ConversationID, "turn_index", d.job.TurnIndex)...)
	}
}
