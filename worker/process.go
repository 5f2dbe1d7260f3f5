package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/tracing"
)

// process settles one valid job. claim is nil for tools without a ledger.
func (w *Worker) process(ctx, startCtx context.Context, d *delivery, claim *ledger.ClaimResult) error {
	if claim == nil {
		return w.runUnclaimed(ctx, startCtx, d)
	}
	return w.settle(ctx, startCtx, d, *claim)
}

// settle is step 4 of DESIGN.md: act on what the claim found.
func (w *Worker) settle(ctx, startCtx context.Context, d *delivery, c ledger.ClaimResult) error {
	row := c.Row
	switch {
	case c.Err != nil: // the key belongs to another call: never hand over its result
		w.ledgerOutcome(d, "collision", nil)
		w.log.Warn("key collision: the ledger row has other material", w.attrs(d, "error", c.Err)...)
		return w.publishRejected(ctx, d, &rejectError{code: "key_collision", message: c.Err.Error()})

	case c.Claimed:
		w.ledgerOutcome(d, "claimed", nil)
		w.cfg.Hook(AfterClaim, d.job)
		w.warnIdenticalCall(ctx, d)
		return w.execute(ctx, startCtx, d, row)

	case row.State == ledger.Completed, row.State == ledger.Failed, row.State == ledger.Indeterminate:
		w.ledgerOutcome(d, "duplicate", &row)
		return w.answerFromLedger(ctx, d, row)

	case !row.LeaseExpired(): // another attempt is running: wait a little for it, then come back
		w.ledgerOutcome(d, "in_flight", &row)
		if settled, ok := w.awaitSettled(ctx, d, row); ok {
			return w.answerFromLedger(ctx, d, settled)
		}
		// Waiting on another attempt is not this job failing: it does not
		// count toward the dead-letter limit.
		return uncountedRetry(min(max(row.LeaseRemaining, 100*time.Millisecond), w.backoff(d)),
			fmt.Errorf("attempt %d holds the lease", row.Attempt))

	case d.tool.Class == tools.KeyedWrite: // the holder died mid-call: run again with the same key
		w.ledgerOutcome(d, "takeover", &row)
		var taken ledger.Row
		err := w.durably(ctx, "takeover", d, func() (err error) {
			taken, err = w.cfg.Ledger.Takeover(ctx, row.Fence(), w.cfg.Owner, d.tool.Lease)
			return err
		})
		if err != nil {
			return w.lostRace(d, err)
		}
		w.log.Warn("took over an expired lease; running again with the same key", w.attrs(d, "attempt", taken.Attempt, "previous_owner", row.Owner)...)
		return w.execute(ctx, startCtx, d, taken)

	default: // an unkeyed write whose holder died mid-call: its outcome is unknown
		w.ledgerOutcome(d, "holder_lost", &row)
		var taken ledger.Row
		err := w.durably(ctx, "takeover", d, func() (err error) {
			taken, err = w.cfg.Ledger.Takeover(ctx, row.Fence(), w.cfg.Owner, d.tool.Lease)
			return err
		})
		if err != nil {
			return w.lostRace(d, err)
		}
		info := ledger.ErrorInfo{Code: "holder_lost", Message: fmt.Sprintf("%s stopped during attempt %d; whether the call took effect is unknown", row.Owner, row.Attempt)}
		if err := w.durably(ctx, "mark indeterminate", d, func() error { return w.cfg.Ledger.MarkIndeterminate(ctx, taken.Fence(), info) }); err != nil {
			return w.lostRace(d, err)
		}
		taken.State, taken.Error = ledger.Indeterminate, &info
		w.count(d, "indeterminate")
		w.log.Warn("unkeyed write left indeterminate: resolve it with consumer ledger resolve", w.attrs(d, "previous_owner", row.Owner)...)
		w.cfg.Hook(AfterComplete, d.job)
		return w.publishResult(ctx, d, w.resultOf(d, taken))
	}
}

// answerFromLedger publishes the stored outcome of a call another delivery
// settled, addressed to this job.
func (w *Worker) answerFromLedger(ctx context.Context, d *delivery, row ledger.Row) error {
	w.count(d, "duplicate")
	w.log.Info("duplicate answered from the ledger", w.attrs(d, "state", row.State, "original_tool_use_id", row.FirstToolUseID)...)
	return w.publishResult(ctx, d, w.resultOf(d, row))
}

// awaitSettled polls the row while another attempt holds it, for up to
// Config.InFlightWait (less when the lease ends sooner), keeping this delivery
// alive with InProgress. It reports the row once that attempt has settled
// it; a retried turn usually arrives while its first attempt is finishing.
func (w *Worker) awaitSettled(ctx context.Context, d *delivery, row ledger.Row) (ledger.Row, bool) {
	deadline := time.Now().Add(min(w.cfg.InFlightWait, row.LeaseRemaining))
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
		got, err := w.cfg.Ledger.Get(ctx, row.Key)
		switch {
		case err != nil: // released (not sent) or unreachable: let the next delivery look again
			return row, false
		case got.State != ledger.InFlight:
			return got, true
		case got.LeaseExpired() || got.Attempt != row.Attempt:
			return row, false
		}
		if time.Since(lastProgress) > w.ackWait/3 {
			d.msg.InProgress()
			lastProgress = time.Now()
		}
	}
	return row, false
}

// execute is step 5: run the tool under the claim, keep the claim alive while
// it runs, record the outcome (fenced by the attempt) and publish the result.
func (w *Worker) execute(ctx, startCtx context.Context, d *delivery, row ledger.Row) error {
	fence := row.Fence()
	stop := w.heartbeat(ctx, d, fence)
	out, outcome, te := w.runTool(startCtx, d, fence.Attempt)
	stop()
	w.cfg.Hook(DuringTool, d.job)
	sctx, span := w.child(ctx, d, "toolq.settle", trace.SpanKindInternal, tracing.KeyToolOutcome.String(outcome.String()))
	defer span.End()
	ctx = sctx
	switch outcome {
	case tools.NotSent: // nothing happened: give the key back
		if err := w.durably(ctx, "release", d, func() error { return w.cfg.Ledger.Release(ctx, fence) }); err != nil {
			return w.fenced(d, err)
		}
		return retryLater(w.delay(d, te), te)

	case tools.Definite: // the downstream said no: that is the result
		if err := w.durably(ctx, "fail", d, func() error { return w.cfg.Ledger.Fail(ctx, fence, infoOf(te)) }); err != nil {
			return w.fenced(d, err)
		}
		row.State, row.Error = ledger.Failed, ptr(infoOf(te))

	case tools.Ambiguous:
		if d.tool.Class == tools.KeyedWrite { // the next delivery retries with the same key
			if err := w.durably(ctx, "end lease", d, func() error { return w.cfg.Ledger.EndLease(ctx, fence, infoOf(te)) }); err != nil {
				return w.fenced(d, err)
			}
			return retryLater(w.delay(d, te), te)
		}
		if err := w.durably(ctx, "mark indeterminate", d, func() error { return w.cfg.Ledger.MarkIndeterminate(ctx, fence, infoOf(te)) }); err != nil {
			return w.fenced(d, err)
		}
		w.count(d, "indeterminate")
		w.log.Warn("unkeyed write left indeterminate: resolve it with consumer ledger resolve", w.attrs(d, "error", te.Error())...)
		row.State, row.Error = ledger.Indeterminate, ptr(infoOf(te))

	case tools.Success:
		if err := w.durably(ctx, "complete", d, func() error {
			err, batchErr := w.commits.do(ctx, ledger.Completion{Fence: fence, Output: out})
			return errors.Join(batchErr, err)
		}); err != nil {
			return w.fenced(d, err)
		}
		row.State, row.Result = ledger.Completed, out
	}
	w.cfg.Hook(AfterComplete, d.job)
	row.UpdatedAt = time.Now().UTC()
	return w.publishResult(ctx, d, w.resultOf(d, row))
}

// runUnclaimed runs a read tool, or a keyed write whose ledger is off: the
// downstream's own dedupe (or the lack of any effect) makes a retry safe.
func (w *Worker) runUnclaimed(ctx, startCtx context.Context, d *delivery) error {
	w.ledgerOutcome(d, "none", nil)
	out, outcome, te := w.runTool(startCtx, d, 0)
	w.cfg.Hook(DuringTool, d.job)
	r := jobs.NewResult(d.job, d.key, jobs.StatusOK)
	r.Attempts = d.deliveries
	switch outcome {
	case tools.NotSent, tools.Ambiguous:
		return retryLater(w.delay(d, te), te)
	case tools.Definite:
		r.Status, r.Error = jobs.StatusError, &jobs.ResultError{Code: te.Code, Message: te.Message}
	case tools.Success:
		r.Output = out
	}
	w.count(d, string(r.Status))
	return w.publishResult(ctx, d, r)
}

// runTool runs the tool under a client span and classifies the outcome.
func (w *Worker) runTool(startCtx context.Context, d *delivery, attempt int64) (json.RawMessage, tools.Outcome, *tools.Error) {
	ctx, span := w.child(startCtx, d, "tool "+d.tool.Name, trace.SpanKindClient,
		tracing.KeyTool.String(d.tool.Name), tracing.KeyToolClass.String(string(d.tool.Class)),
		attribute.String("toolq.downstream", d.tool.Downstream), attribute.Int64("toolq.attempt", attempt))
	defer span.End()
	start := time.Now()
	out, err := d.tool.Run(ctx, w.request(d, attempt))
	outcome, te := tools.Classify(err)
	defer w.observeTool(d, start, outcome)
	if errors.Is(err, tools.ErrInvalidArgs) { // validated before the claim; kept for safety
		outcome, te = tools.Definite, tools.DefiniteError("invalid_args", err.Error())
	}
	span.SetAttributes(tracing.KeyToolOutcome.String(outcome.String()))
	if te != nil {
		span.SetAttributes(attribute.String("toolq.error.code", te.Code))
		if outcome != tools.Success {
			span.SetStatus(codes.Error, te.Code)
		}
	}
	return out, outcome, te
}

func (w *Worker) request(d *delivery, attempt int64) tools.Request {
	return tools.Request{Tool: d.job.Tool, Key: d.key, Args: d.material.Canonical, ToolUseID: d.job.ToolUseID, Attempt: attempt}
}

// resultOf is the result of this job as the ledger row records it: a
// duplicate when the row was claimed by another tool_use_id.
func (w *Worker) resultOf(d *delivery, row ledger.Row) *jobs.Result {
	r := jobs.NewResult(d.job, d.key, jobs.StatusOK)
	r.Attempts = int(row.Attempt)
	r.CompletedAt = row.UpdatedAt
	switch row.State {
	case ledger.Completed:
		r.Output = row.Result
	case ledger.Failed:
		r.Status = jobs.StatusError
	case ledger.Indeterminate:
		r.Status = jobs.StatusIndeterminate
	}
	if row.Error != nil && row.State != ledger.Completed {
		r.Error = &jobs.ResultError{Code: row.Error.Code, Message: row.Error.Message}
	}
	if row.FirstToolUseID != d.job.ToolUseID {
		r.Duplicate, r.OriginalToolUseID = true, row.FirstToolUseID
	}
	if !r.Duplicate {
		w.count(d, string(r.Status))
	}
	return r
}

// publishResult is step 6: publish the result and wait for JetStream to
// have it. The message id makes a second publication after a crash a no-op.
func (w *Worker) publishResult(ctx context.Context, d *delivery, r *jobs.Result) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	subject, msgID := jobs.ResultSubject(d.job.ConversationID), jobs.ResultMsgID(d.key, d.job.ToolUseID)
	ctx, span := w.child(ctx, d, "publish toolq.results", trace.SpanKindProducer,
		tracing.MessagingSystem.String("nats"), tracing.MessagingDestination.String(subject),
		tracing.MessagingMessageID.String(msgID), tracing.MessagingOperation.String("send"),
		tracing.KeyResultStatus.String(string(r.Status)), tracing.KeyDuplicate.Bool(r.Duplicate))
	defer span.End()
	d.span.SetAttributes(tracing.KeyResultStatus.String(string(r.Status)), tracing.KeyDuplicate.Bool(r.Duplicate))
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set(jobs.HeaderKey, d.key)
	w.propagator.Inject(ctx, jobs.HeaderCarrier(msg.Header))
	err = w.durably(ctx, "publish result", d, func() error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := w.cfg.JS.PublishMsg(pctx, msg, jetstream.WithMsgID(msgID)); err != nil {
			return &brokerError{err}
		}
		return nil
	})
	if err != nil {
		return uncountedRetry(w.backoff(d), fmt.Errorf("publish result: %w", err))
	}
	w.cfg.Hook(AfterPublish, d.job)
	return nil
}

// publishRejected answers a job that cannot run: nothing ran, and the agent
// learns why.
func (w *Worker) publishRejected(ctx context.Context, d *delivery, rej *rejectError) error {
	w.count(d, "rejected")
	w.log.Info("job rejected", w.attrs(d, "code", rej.code, "reason", rej.message)...)
	r := jobs.NewResult(d.job, d.key, jobs.StatusRejected)
	r.Error = &jobs.ResultError{Code: rej.code, Message: rej.message}
	r.Attempts = 0
	return w.publishResult(ctx, d, r)
}

// warnIdenticalCall logs a job that repeats an earlier call of the same turn
// (same tool and args, a higher ordinal): allowed, and usually a model error.
func (w *Worker) warnIdenticalCall(ctx context.Context, d *delivery) {
	if d.job.Ordinal == 0 {
		return
	}
	first := d.job.Call()
	first.Ordinal = 0
	key, err := first.Key()
	if err != nil {
		return
	}
	if row, err := w.cfg.Ledger.Get(ctx, key); err == nil {
		w.log.Warn("identical call repeated in one turn (ordinal > 0): running it, as asked; usually a model error",
			w.attrs(d, "ordinal", d.job.Ordinal, "first_tool_use_id", row.FirstToolUseID, "conversation_id", d.job.ConversationID, "turn_index", d.job.TurnIndex)...)
	}
}

// heartbeat extends the lease and tells JetStream the job is in progress
// until stop is called, so neither the claim nor the delivery runs out while
// a tool runs.
func (w *Worker) heartbeat(ctx context.Context, d *delivery, fence ledger.Fence) (stop func()) {
	every := max(min(d.tool.Lease, w.ackWait)/3, 50*time.Millisecond)
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
			case <-t.C:
				if err := w.cfg.Ledger.Extend(ctx, fence, d.tool.Lease); err != nil {
					w.log.Warn("lease extension failed", w.attrs(d, "error", err)...)
				}
				d.msg.InProgress()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// fenced handles a refused write after the tool ran: another attempt owns
// the key now (our lease expired and was taken over). This zombie publishes
// nothing; the job comes back and is answered from the ledger.
func (w *Worker) fenced(d *delivery, err error) error {
	if errors.Is(err, ledger.ErrFenced) || errors.Is(err, ledger.ErrNotFound) {
		w.count(d, "fenced")
		w.log.Warn("lost the claim while the tool ran; publishing nothing", w.attrs(d, "error", err)...)
		return retryLater(w.cfg.RetryDelay, err)
	}
	return err
}

// lostRace handles a takeover that another worker won, or a lease that was
// renewed meanwhile: look again later.
func (w *Worker) lostRace(d *delivery, err error) error {
	if errors.Is(err, ledger.ErrFenced) || errors.Is(err, ledger.ErrLeaseHeld) || errors.Is(err, ledger.ErrNotFound) {
		return retryLater(200*time.Millisecond, err)
	}
	return err
}

// delay is the tool's retry hint, or the worker's backoff.
func (w *Worker) delay(d *delivery, te *tools.Error) time.Duration {
	if te != nil && te.RetryAfter > 0 {
		return te.RetryAfter
	}
	return w.backoff(d)
}

// deadLetter publishes the message to toolq.dlq.<reason> with its headers,
// the reason and what the ledger knew, then terminates it. If the dead
// letter cannot be published the job is nak'ed instead: never dropped.
func (w *Worker) deadLetter(ctx context.Context, d *delivery, dead *deadLetterError) {
	msg := nats.NewMsg(jobs.DLQSubject(dead.reason))
	msg.Data = d.msg.Data()
	for k, v := range d.msg.Headers() {
		if !strings.HasPrefix(k, "Nats-") { // JetStream's control headers (msg id, expected stream) would misdirect the copy
			msg.Header[k] = v
		}
	}
	var seq uint64
	if d.meta != nil {
		seq = d.meta.Sequence.Stream
	}
	msg.Header.Set(jobs.HeaderDLQReason, dead.reason)
	msg.Header.Set(jobs.HeaderDLQDetail, oneLine(dead.err.Error()))
	msg.Header.Set(jobs.HeaderDLQSubject, d.msg.Subject())
	msg.Header.Set(jobs.HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	msg.Header.Set(jobs.HeaderDLQDeliveries, strconv.Itoa(d.deliveries))
	msg.Header.Set(jobs.HeaderDLQConsumer, w.consumer.CachedInfo().Name)
	if d.key != "" {
		if row, err := w.cfg.Ledger.Get(ctx, d.key); err == nil {
			msg.Header.Set(jobs.HeaderDLQHistory, fmt.Sprintf("key=%s state=%s attempt=%d owner=%s error=%s", row.Key, row.State, row.Attempt, row.Owner, errorText(row.Error)))
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := w.cfg.JS.PublishMsg(pctx, msg, jetstream.WithMsgID(fmt.Sprintf("dlq:%d:%s", seq, dead.reason))); err != nil {
		w.log.Error("dead letter not published; the job will be redelivered", w.attrs(d, "error", err)...)
		w.ack(d, d.msg.NakWithDelay(w.backoff(d)))
		return
	}
	w.log.Warn("job dead-lettered", w.attrs(d, "reason", dead.reason, "detail", dead.err.Error())...)
	w.ack(d, d.msg.TermWithReason(dead.reason))
}

func errorText(e *ledger.ErrorInfo) string {
	if e == nil {
		return ""
	}
	return e.Code + ": " + e.Message
}

func infoOf(te *tools.Error) ledger.ErrorInfo {
	if te == nil {
		return ledger.ErrorInfo{Code: "unknown"}
	}
	return ledger.ErrorInfo{Code: te.Code, Message: te.Message}
}

func ptr[T any](v T) *T { return &v }

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

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

// durably runs op until it succeeds, fails for a reason other than an
// outage of the ledger or the broker, or ctx ends. While it waits it tells
// JetStream the jobs are in progress, so that an outage costs them no
// delivery (and so never sends them to the DLQ).
func (w *Worker) durably(ctx context.Context, what string, d *delivery, op func() error) error {
	return w.durablyAll(ctx, what, []*delivery{d}, op)
}

func (w *Worker) durablyAll(ctx context.Context, what string, ds []*delivery, op func() error) error {
	delay := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := op()
		if err == nil || !transient(err) {
			if attempt > 0 && err == nil {
				w.log.Info(what+" succeeded after an outage", "retries", attempt)
			}
			return err
		}
		if attempt == 0 {
			w.log.Warn(what+" failed; retrying until the outage ends", "jobs", len(ds), "error", err)
		}
		for _, d := range ds {
			d.msg.InProgress()
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		delay = min(delay*2, 5*time.Second, w.ackWait/3) // InProgress often enough to keep the deliveries
	}
}
