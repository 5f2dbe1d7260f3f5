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

// heartbeat extends the lease and tells JetStream the job is in progress
// until stop is called, so neither the claim nor the delivery runs out while
// a tool runs. With a zero fence (a tool without a ledger row) it only
// keeps the delivery.
func (d *delivery) heartbeat(fence ledger.Fence) (stop func()) {
	every := max(min(d.tool.Lease, d.w.ackWait)/3, 50*time.Millisecond)
	// An executor that ignores its context can outlive its timeout: past
	// the timeout and a grace period (half the timeout, at least a second)
	// the heartbeat stops, so that the lease
	// and the delivery run out and the call is settled as a holder that
	// stopped (taken over, or indeterminate), never kept alive forever.
	giveUp := time.After(d.tool.Timeout + max(d.tool.Timeout/2, time.Second))
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-giveUp:
				d.w.log.ErrorContext(d.ctx, "the tool outlived its timeout; no longer keeping its claim and delivery alive", d.attrs("timeout", d.tool.Timeout)...)
				<-done
				return
			case <-t.C:
				if fence.Key != "" {
					if err := d.w.cfg.Ledger.Extend(d.runCtx, fence, d.tool.Lease); err != nil {
						d.w.log.WarnContext(d.ctx, "lease extension failed", d.attrs("error", err)...)
					}
				}
				d.msg.InProgress()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
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
