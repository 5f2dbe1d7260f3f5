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
type keepalive struct {
	d       *delivery
	fence   ledger.Fence // zero for a tool without a ledger row
	started chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup

	mu        sync.Mutex
	heldUntil time.Time // the lease is surely ours until then (monotonic)
	lost      error     // the ledger refused an extension: the claim is another's
}

// heartbeat starts keeping the delivery, and the claim behind fence, alive
// until stop is called. heldSince is when the request that set the claim's
// lease was sent (or earlier): the lease is ours until heldSince plus the
// lease at least. With a zero fence (a tool without a ledger row) it only
// keeps the delivery.
func (d *delivery) heartbeat(fence ledger.Fence, heldSince time.Time) *keepalive {
	k := &keepalive{d: d, fence: fence, started: make(chan struct{}), done: make(chan struct{}), heldUntil: heldSince.Add(d.tool.Lease)}
	every := max(min(d.tool.Lease, d.w.ackWait)/3, 50*time.Millisecond)
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		// An executor that ignores its context can outlive its timeout:
		// past the timeout and a grace period (half the timeout, at least a
		// second) from the start of the call, the heartbeat stops, so that
		// the lease and the delivery run out and the call is settled as a
		// holder that stopped (taken over, or indeterminate), never kept
		// alive forever. The wait for a slot does not count.
		var giveUp <-chan time.Time
		started := k.started
		for {
			select {
			case <-k.done:
				return
			case <-started:
				started, giveUp = nil, time.After(d.tool.Timeout+max(d.tool.Timeout/2, time.Second))
			case <-giveUp:
				d.w.log.ErrorContext(d.ctx, "the tool outlived its timeout; no longer keeping its claim and delivery alive", d.attrs("timeout", d.tool.Timeout)...)
				<-k.done
				return
			case <-t.C:
				if fence.Key != "" {
					if err := k.extend(); err != nil {
						d.w.log.WarnContext(d.ctx, "lease extension failed", d.attrs("error", err)...)
					}
				}
				d.msg.InProgress()
			}
		}
	}()
	return k
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
	close(k.started)
	return nil
}

// stop ends the heartbeat and waits for it.
func (k *keepalive) stop() {
	close(k.done)
	k.wg.Wait()
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
