package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/tracing"
)

// delivery is one message delivered by JetStream and everything learned of
// it on the way through run: the decoded job, the tool, the key, the
// process span.
type delivery struct {
	w          *Worker
	msg        jetstream.Msg
	meta       *jetstream.MsgMetadata
	deliveries int // JetStream's count, this delivery included

	job      *jobs.Job
	material jobs.Material
	key      string
	tool     *tools.Tool

	ctx      context.Context // carries the process span
	span     trace.Span
	dupRoute string // how a duplicate came back (route), for its metric

	// runCtx lives until the drain gives up on running jobs; startCtx ends
	// when the drain starts: a tool call that has not begun by then is
	// handed back instead.
	runCtx, startCtx context.Context
	// token is unique to this delivery's claim (ledger.Claim.Token).
	token string
	// leaseSince is when the request that set the lease of this delivery's
	// claim (or takeover) was sent, or earlier: the lease is held until
	// then plus the tool's lease at least.
	leaseSince time.Time
}

// run processes one delivery: the state machine of docs/design.md ("One
// delivery"), top to bottom, its steps numbered as there. It returns the
// one verdict that settle turns into a JetStream verb; nothing in it
// acknowledges the message.
func (d *delivery) run() verdict {
	// 1. Decode and validate. What is not a valid job is never run: it
	// goes to the DLQ. A valid job that cannot run (unknown tool, bad args,
	// a forged key) gets a rejected result.
	refusal := d.decode()
	d.startSpan()
	if refusal != nil {
		return d.refuse(refusal)
	}

	// A call whose key the member-order fix changed acts under its old key
	// when it has a ledger row, or was sent downstream, under it.
	if err := d.useLegacyKey(); err != nil {
		return retryUncounted(d.w.backoff(d), fmt.Errorf("legacy key: %w", err))
	}

	// 2. Reads, and keyed writes with the ledger off, run without a claim:
	// a retry is safe (no effect, or the downstream collapses it).
	if !d.tool.UsesLedger {
		return d.runUnclaimed()
	}

	// 3. Claim the key before running, and act on what the ledger holds.
	// While the downstream's breaker is open a claim would only be given
	// back: answer a settled call from the ledger, hand the rest back.
	if wait := d.tool.BreakerWait(); wait > 0 {
		return d.breakerOpen(wait)
	}
	claim, err := d.claim()
	if err != nil {
		return retryUncounted(d.w.backoff(d), fmt.Errorf("claim: %w", err))
	}
	row := claim.Row
	switch {
	case claim.Err != nil: // the key belongs to another call: never hand over its result
		return d.collision(claim.Err)
	case claim.Claimed:
		return d.claimed(row)
	case row.State == ledger.AwaitingApproval: // a person has not decided yet
		return d.pending(row)
	case row.State == ledger.Completed, row.State == ledger.Failed, row.State == ledger.Indeterminate:
		return d.duplicate(row, ledgerDuplicate)
	case !row.LeaseExpired(): // another attempt is running
		return d.awaitOther(row)
	case d.tool.Class == tools.KeyedWrite: // its holder died mid-call: run again with the same key
		return d.takeOver(row)
	case d.tool.Class == tools.TransactionalWrite: // its holder died mid-call: its transaction did not commit
		return d.takeOver(row)
	default: // an unkeyed write whose holder died mid-call: the effect is unknown
		return d.holderLost(row)
	}
}

// refusal is why a delivery is not run: a dead letter (reason set) or a
// rejected result (code set).
type refusal struct {
	reason        string // jobs.DLQ*: the message is not a job
	code, message string // a rejected result's error
	err           error
}

// decode fills the delivery from its message, as far as it can, and says
// why the job cannot run, or nil.
func (d *delivery) decode() *refusal {
	msg := d.msg
	if d.meta == nil {
		return &refusal{reason: jobs.DLQInvalid, err: fmt.Errorf("not a JetStream message")}
	}
	if len(msg.Data()) > d.w.cfg.MaxBodySize {
		return &refusal{reason: jobs.DLQTooLarge, err: fmt.Errorf("body of %d bytes exceeds the limit of %d", len(msg.Data()), d.w.cfg.MaxBodySize)}
	}
	job, material, err := jobs.DecodeJobMaterial(msg.Data())
	if err != nil {
		return &refusal{reason: jobs.DLQInvalid, err: err}
	}
	d.job = job
	if subj := jobs.TenantJobSubject(job.Tenant, job.Tool); msg.Subject() != subj {
		if t, ok := jobs.SubjectTenant(msg.Subject()); ok && t != job.Tenant { // never run as the tenant it names
			return &refusal{reason: jobs.DLQInvalid, err: fmt.Errorf("job of tenant %q published on %s, a subject of tenant %q: want %s", job.Tenant, msg.Subject(), t, subj)}
		}
		return &refusal{reason: jobs.DLQInvalid, err: fmt.Errorf("job for tool %q published on %s, want %s", job.Tool, msg.Subject(), subj)}
	}
	d.material, d.key = material, material.Key()
	for _, sent := range msg.Headers().Values(jobs.HeaderKey) { // every value: a forged one may come second
		if sent != "" && sent != d.key && !d.isLegacyKey(sent) {
			return &refusal{code: "key_mismatch", message: fmt.Sprintf("the publisher's %s %q differs from the derived key %s", jobs.HeaderKey, cut(sent, 64), d.key)}
		}
	}
	tool, ok := d.w.cfg.Tools.Lookup(job.Tool)
	if !ok {
		return &refusal{code: "unknown_tool", message: fmt.Sprintf("no tool %q is registered", job.Tool)}
	}
	d.tool = tool
	if err := d.validate(); err != nil {
		return &refusal{code: "invalid_args", message: err.Error()}
	}
	return nil
}

// validate checks the job's args against its tool's schema, from the parse
// that made the key.
func (d *delivery) validate() error {
	if inst, ok := d.material.ArgsInstance(); ok {
		return d.tool.ValidateInstance(d.job.Args, inst)
	}
	return d.tool.Validate(d.job.Args)
}

// refuse dead-letters what is not a job, and answers a job that cannot run
// with a rejected result: nothing ran, and the agent learns why.
func (d *delivery) refuse(r *refusal) verdict {
	if r.reason != "" {
		return deadLettered(r.reason, r.err)
	}
	if d.decided() && d.key != "" && r.code != "key_mismatch" { // an approved call that can no longer run
		return d.refuseDecided(r)
	}
	d.w.log.InfoContext(d.ctx, "job rejected", d.attrs("code", r.code, "reason", r.message)...)
	res := jobs.NewResult(d.job, d.key, jobs.StatusRejected)
	res.Error = &jobs.ResultError{Code: r.code, Message: r.message}
	res.Attempts = 0
	return d.publish(res, OutcomeRejected)
}

// claim asks the group-commit batcher for this job's claim, riding out a
// ledger outage until the drain starts.
func (d *delivery) claim() (ledger.ClaimResult, error) {
	ctx, span := d.child(d.runCtx, "toolq.claim", trace.SpanKindClient, d.w.ledgerAttrs("claim"))
	defer span.End()
	start := time.Now()
	d.leaseSince = start // the first try's: a lost answer's claim may be the one that committed
	var claim ledger.ClaimResult
	unanswered := false // a claim may have committed without its answer reaching us
	err := d.durably(d.startCtx, "claim", func() (err error) {
		claim, err = d.w.claims.do(ctx, d.w.claimOf(d))
		unanswered = unanswered || (err != nil && transient(err))
		return err
	})
	d.w.metrics.claimLatency.Record(d.runCtx, time.Since(start).Seconds())
	if err != nil {
		span.RecordError(err)
		if unanswered {
			d.giveBackUnanswered(ctx)
		}
		return claim, err
	}
	if !claim.Claimed && claim.Err == nil && unanswered && d.ownClaim(claim.Row) {
		d.w.log.InfoContext(d.ctx, "the claim had committed before its answer was lost; running it", d.attrs("attempt", claim.Row.Attempt)...)
		claim.Claimed = true
	}
	if claim.Claimed {
		d.w.held.Store(d.key, d)
	}
	return claim, nil
}

// giveBackUnanswered releases this delivery's claim when one committed
// without its answer reaching us and the claim was then abandoned (the
// drain started): a claim left in flight would wait out its lease, and an
// unkeyed write that was never sent would then be answered indeterminate.
// It rides out a ledger outage until the drain gives up on running jobs.
func (d *delivery) giveBackUnanswered(ctx context.Context) {
	err := d.durably(d.runCtx, "give back the claim", func() error {
		row, err := d.w.cfg.Ledger.Get(ctx, d.key)
		if errors.Is(err, ledger.ErrNotFound) {
			return nil // it never committed, or was released
		}
		if err != nil {
			return err
		}
		if row.State != ledger.InFlight || row.ClaimToken != d.token {
			return nil // not this delivery's claim
		}
		return d.w.cfg.Ledger.Release(ctx, row.Fence())
	})
	if err != nil && !isFenced(err) {
		d.w.log.WarnContext(d.ctx, "could not give back a claim whose answer was lost; it waits out its lease", d.attrs("error", err)...)
	}
}

// ownClaim reports whether an in-flight row is this delivery's own claim,
// committed by an attempt whose answer was lost: it carries this delivery's
// claim token, and no other delivery of this process holds the key.
func (d *delivery) ownClaim(row ledger.Row) bool {
	if row.State != ledger.InFlight || row.ClaimToken == "" || row.ClaimToken != d.token {
		return false
	}
	_, taken := d.w.held.LoadOrStore(d.key, d)
	return !taken
}

// collision refuses a job whose key is held by a row with other material: a
// key collision or tampering.
func (d *delivery) collision(err error) verdict {
	d.noteFinding(ledgerCollision, nil)
	d.explainDuplicate(ledgerCollision, nil)
	d.w.log.WarnContext(d.ctx, "key collision: the ledger row has other material", d.attrs("error", err)...)
	return d.refuse(&refusal{code: "key_collision", message: err.Error()})
}

// claimed runs a call this delivery claimed first.
func (d *delivery) claimed(row ledger.Row) verdict {
	d.noteFinding(ledgerClaimed, nil)
	d.hook(AfterClaim)
	d.warnIdenticalCall()
	return d.execute(row)
}

// duplicate answers from the ledger a call another delivery settled, with
// the stored result addressed to this job's tool_use_id.
func (d *delivery) duplicate(row ledger.Row, found finding) verdict {
	if row.State == ledger.AwaitingApproval { // the attempt it waited on asked for approval
		return d.pending(row)
	}
	d.noteFinding(found, &row)
	d.explainDuplicate(found, &row)
	if d.w.log.Enabled(d.ctx, slog.LevelInfo) { // the common case: not built when not logged
		d.w.log.InfoContext(d.ctx, "duplicate answered from the ledger", d.attrs("state", row.State, "original_tool_use_id", row.FirstToolUseID)...)
	}
	if d.decided() { // toolq's own job of a denied or expired call: no duplicate of anything
		return d.answer(row, OutcomeDecided)
	}
	return d.answer(row, OutcomeDuplicate)
}

// awaitOther waits a little in process for the attempt holding the lease
// (a retried turn usually arrives while its first attempt finishes), then
// hands the job back. Waiting is not this job failing: it does not count
// toward the delivery limit.
func (d *delivery) awaitOther(row ledger.Row) verdict {
	if settled, ok := d.awaitSettled(row); ok {
		return d.duplicate(settled, ledgerInFlight)
	}
	d.noteFinding(ledgerInFlight, &row)
	return retryUncounted(min(max(row.LeaseRemaining, 100*time.Millisecond), d.w.backoff(d)),
		fmt.Errorf("attempt %d holds the lease", row.Attempt))
}

// takeOver runs a keyed write again with the same key after its holder's
// lease ran out: the downstream collapses a second effect. A transactional
// write runs again too: its holder's transaction never committed (a
// committed one would have completed the row), so it left nothing.
func (d *delivery) takeOver(row ledger.Row) verdict {
	d.noteFinding(ledgerTakeover, &row)
	taken, err := d.takeoverOf(row)
	if err != nil {
		return d.lostRace(err)
	}
	// A holder that ended its lease on purpose (an uncertain outcome)
	// counted its failed try and left its error; one that died mid-call
	// did neither: its try counts now. A call that keeps stopping its
	// worker is dead-lettered at the limit, its lease ended so that a
	// requeue takes it over.
	if row.Error == nil {
		d.countTakeover()
		tries, err := d.failedTry(d.runCtx, taken)
		if err != nil {
			return d.lostClaim(err)
		}
		if d.w.limit.exhausts(tries) {
			info := ledger.ErrorInfo{Code: "holder_lost", Message: fmt.Sprintf("%s stopped during attempt %d, the call's try %d", row.Owner, row.Attempt, tries)}
			if err := d.durably(d.runCtx, "end lease", func() error { return d.w.cfg.Ledger.EndLease(d.runCtx, taken.Fence(), info) }); err != nil {
				return d.lostClaim(err)
			}
			return deadLettered(jobs.DLQMaxDeliver, fmt.Errorf("its worker stopped during %d tries of the call: a job that keeps stopping its worker", tries))
		}
		taken.Failures = tries
	}
	d.w.log.WarnContext(d.ctx, "took over an expired lease; running again with the same key", d.attrs("attempt", taken.Attempt, "previous_owner", row.Owner)...)
	return d.execute(taken)
}

// holderLost settles an unkeyed write whose holder stopped mid-call: it is
// never run again. The row becomes indeterminate, for an operator.
func (d *delivery) holderLost(row ledger.Row) verdict {
	d.noteFinding(ledgerHolderLost, &row)
	taken, err := d.takeoverOf(row)
	if err != nil {
		return d.lostRace(err)
	}
	d.countTakeover()
	info := ledger.ErrorInfo{Code: "holder_lost", Message: fmt.Sprintf("%s stopped during attempt %d; whether the call took effect is unknown", row.Owner, row.Attempt)}
	if err := d.durably(d.runCtx, "mark indeterminate", func() error { return d.w.cfg.Ledger.MarkIndeterminate(d.runCtx, taken.Fence(), info) }); err != nil {
		return d.lostRace(err)
	}
	taken.State, taken.Error = ledger.Indeterminate, &info
	d.countIndeterminate()
	d.w.log.WarnContext(d.ctx, "unkeyed write left indeterminate: resolve it with consumer ledger resolve", d.attrs("previous_owner", row.Owner)...)
	d.hook(AfterComplete)
	return d.answer(taken, OutcomeIndeterminate)
}

// execute is step 4: run the tool under the claim, keeping the claim and
// the delivery alive while it runs, record the outcome fenced by the
// attempt, and publish the result.
func (d *delivery) execute(row ledger.Row) verdict {
	if d.needsApproval(row) { // a person decides first: the call waits in the ledger
		return d.requestApproval(row)
	}
	if d.tool.Class == tools.TransactionalWrite {
		return d.executeTx(row)
	}
	fence := row.Fence()
	keep := d.heartbeat(fence, d.leaseSince)
	out, result, te := d.runTool(fence.Attempt, keep)
	keep.stop()
	d.hook(DuringTool)
	ctx, span := d.child(d.runCtx, "toolq.settle", trace.SpanKindClient, d.w.ledgerAttrs("settle", tracing.KeyToolOutcome.String(result.String())))
	defer span.End()
	store := d.w.cfg.Ledger
	label := OutcomeOK
	var err error
	switch result {
	case tools.NotSent: // nothing happened: give the key back
		if te != nil && isFenced(te) { // the claim lapsed while the call waited for its slot
			return d.unsentOnLostClaim(te)
		}
		var tries int64
		if !d.heldBack(te) {
			if tries, err = d.failedTry(ctx, row); err != nil {
				return d.lostClaim(err)
			}
		}
		if err := d.durably(ctx, "release", func() error { return store.Release(ctx, fence) }); err != nil {
			return d.lostClaim(err)
		}
		return d.notSent(te, tries)

	case tools.Definite: // the downstream said no: that is the result from now on
		info := infoOf(te)
		if err := d.durably(ctx, "fail", func() error { return store.Fail(ctx, fence, info) }); err != nil {
			return d.lostClaim(err)
		}
		row.State, row.Error, label = ledger.Failed, &info, OutcomeError

	case tools.Ambiguous:
		info := infoOf(te)
		if d.tool.Class == tools.KeyedWrite { // the next delivery retries with the same key
			tries, err := d.failedTry(ctx, row)
			if err != nil {
				return d.lostClaim(err)
			}
			if err := d.durably(ctx, "end lease", func() error { return store.EndLease(ctx, fence, info) }); err != nil {
				return d.lostClaim(err)
			}
			o := retryAfter(d.delay(te), te)
			o.tries = tries
			return o
		}
		if err := d.durably(ctx, "mark indeterminate", func() error { return store.MarkIndeterminate(ctx, fence, info) }); err != nil {
			return d.lostClaim(err)
		}
		d.countIndeterminate()
		d.w.log.WarnContext(d.ctx, "unkeyed write left indeterminate: resolve it with consumer ledger resolve", d.attrs("error", te.Error())...)
		row.State, row.Error, label = ledger.Indeterminate, &info, OutcomeIndeterminate

	case tools.Success:
		if err := d.durably(ctx, "complete", func() error {
			err, batchErr := d.w.commits.do(ctx, ledger.Completion{Fence: fence, Output: out})
			return errors.Join(batchErr, err)
		}); err != nil {
			return d.lostClaim(err)
		}
		row.State, row.Result = ledger.Completed, out
	}
	d.hook(AfterComplete)
	row.UpdatedAt = time.Now().UTC()
	return d.answer(row, label)
}

// executeTx is step 4 for a transactional write: the tool's effect runs in
// the ledger's transaction that completes the claim, so that the two
// commit together or not at all. A call whose transaction did not commit
// left nothing, and runs again: it is never indeterminate (unless its
// executor ended the transaction itself, against its contract).
func (d *delivery) executeTx(row ledger.Row) verdict {
	fence := row.Fence()
	out, te, err := d.runToolTx(fence)
	ctx, span := d.child(d.runCtx, "toolq.settle", trace.SpanKindClient, d.w.ledgerAttrs("settle", tracing.KeyToolOutcome.String(outcomeOf(te, err).String())))
	defer span.End()
	store := d.w.cfg.Ledger
	label := OutcomeOK
	switch {
	case err != nil: // the ledger's: the transaction did not commit, or the answer to its commit was lost
		return d.uncommitted(ctx, row, nil, err)
	case te == nil: // committed, with the completion
		row.State, row.Result = ledger.Completed, out
	case te.Outcome == tools.Definite: // the tool said no, and its transaction rolled back: that is the result from now on
		info := infoOf(te)
		if err := d.durably(ctx, "fail", func() error { return store.Fail(ctx, fence, info) }); err != nil {
			return d.lostClaim(err)
		}
		row.State, row.Error, label = ledger.Failed, &info, OutcomeError
	case te.Code == tools.CodeTxEnded: // its executor ended the transaction: what it wrote may have committed alone
		info := infoOf(te)
		if err := d.durably(ctx, "mark indeterminate", func() error { return store.MarkIndeterminate(ctx, fence, info) }); err != nil {
			return d.lostClaim(err)
		}
		d.countIndeterminate()
		d.w.log.ErrorContext(d.ctx, "a transactional executor ended its transaction; left indeterminate: resolve it with consumer ledger resolve", d.attrs("error", te.Error())...)
		row.State, row.Error, label = ledger.Indeterminate, &info, OutcomeIndeterminate
	default: // not sent, or failed: the transaction rolled back, and nothing happened
		return d.uncommitted(ctx, row, te, nil)
	}
	d.hook(AfterComplete)
	row.UpdatedAt = time.Now().UTC()
	return d.answer(row, label)
}

// uncommitted hands back a transactional call whose transaction did not
// commit: te is the tool's error (its try counts, unless it was held
// back), or err the ledger's. The claim is released for the next delivery,
// under its fence: a release that is fenced out means the claim is no
// longer this delivery's, or that the transaction committed after all (the
// answer to its commit was lost), which the row then shows.
func (d *delivery) uncommitted(ctx context.Context, row ledger.Row, te *tools.Error, err error) verdict {
	switch {
	case isFenced(err):
		return d.lostClaim(err)
	case te != nil && isFenced(te): // the claim lapsed while the call waited for its slot
		return d.unsentOnLostClaim(te)
	}
	var tries int64
	if te != nil && !d.heldBack(te) {
		var cerr error
		if tries, cerr = d.failedTry(ctx, row); cerr != nil {
			return d.lostClaim(cerr)
		}
	}
	fence := row.Fence()
	rerr := d.durably(ctx, "release", func() error { return d.w.cfg.Ledger.Release(ctx, fence) })
	switch {
	case rerr == nil && te != nil:
		return d.notSent(te, tries)
	case rerr == nil && transient(err): // nothing happened, for no fault of the call's
		return retryUncounted(d.w.backoff(d), fmt.Errorf("the transaction did not commit: %w", err))
	case rerr == nil: // nothing happened, and not an outage: counted, so that it ends at the limit
		return retryAfter(d.w.backoff(d), fmt.Errorf("the transaction did not commit: %w", err))
	case !isFenced(rerr):
		return d.lostClaim(rerr)
	}
	var got ledger.Row
	gerr := d.durably(ctx, "read the row", func() (err error) {
		got, err = d.w.cfg.Ledger.Get(ctx, d.key)
		return err
	})
	if gerr != nil || got.State != ledger.Completed || got.ClaimToken != fence.Token || got.Attempt != fence.Attempt {
		return d.lostClaim(rerr)
	}
	d.w.log.InfoContext(d.ctx, "the transaction had committed before the answer to its commit was lost", d.attrs("attempt", got.Attempt)...)
	d.hook(AfterComplete)
	return d.answer(got, OutcomeOK)
}

// runToolTx runs a transactional tool under a client span: its effect in
// the ledger's transaction that completes the claim. te is the tool's
// error (its transaction did not commit, or its executor ended it), err
// the ledger's.
//
// The claim's lease is extended while the call waits for its slot, and no
// longer once its transaction has begun: the transaction holds the row
// locked, so that no takeover changes it until the transaction ends, and
// an extension through another connection would only wait for that lock
// (or, under repeatable read or serializable isolation, make the
// completion fail to serialize). The delivery is still kept alive.
func (d *delivery) runToolTx(fence ledger.Fence) (out json.RawMessage, te *tools.Error, err error) {
	keep := d.heartbeat(fence, d.leaseSince)
	defer keep.stop()
	ctx, span := d.child(d.startCtx, "execute_tool "+d.tool.Name, trace.SpanKindInternal, d.toolAttrs(fence.Attempt))
	defer span.End()
	start := time.Now()
	defer func() { d.w.observeTool(d, start, outcomeOf(te, err)) }()
	inTx := func(ctx context.Context, effect func(context.Context, pgx.Tx) (json.RawMessage, error)) (json.RawMessage, error) {
		// A holder holds a call for a lease: its transaction ends by then
		// (the tool's timeout is shorter), or the server ends it.
		ctx, cancel := context.WithTimeout(ctx, d.tool.Lease)
		defer cancel()
		keep.stop()
		progress := d.heartbeat(ledger.Fence{}, time.Now()) // the delivery's alone
		defer progress.stop()
		progress.beforeSend(ctx) // starts its give-up clock: the call starts now
		return d.w.cfg.Ledger.CompleteTx(ctx, fence, func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
			out, err := effect(ctx, tx)
			d.hook(DuringTool) // the tool has answered; nothing is committed
			return out, err
		})
	}
	out, err = d.tool.RunTx(ctx, d.request(fence.Attempt), inTx, tools.BeforeSend(keep.beforeSend))
	switch {
	case errors.As(err, &te):
		err = nil
	case errors.Is(err, ledger.ErrTxEnded):
		te, err = tools.AmbiguousError(tools.CodeTxEnded, "the executor ended the transaction it was given: what it wrote may have committed without the call's ledger row", 0, err), nil
	}
	if span.IsRecording() {
		span.SetAttributes(tracing.KeyToolOutcome.String(outcomeOf(te, err).String()))
	}
	switch {
	case te != nil:
		if span.IsRecording() {
			span.SetAttributes(tracing.KeyErrorCode.String(te.Code))
		}
		span.SetStatus(codes.Error, te.Code)
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, "ledger")
	}
	return out, te, err
}

// outcomeOf is a transactional call's outcome as the tool's metrics and
// spans count it: a transaction the ledger did not commit sent nothing.
func outcomeOf(te *tools.Error, err error) tools.Outcome {
	switch {
	case te != nil:
		return te.Outcome
	case err != nil:
		return tools.NotSent
	}
	return tools.Success
}

// unsentOnLostClaim hands back a call that was never sent because its
// claim is another's now (it lapsed while the call waited for its slot, and
// another delivery took it): the job comes back and is answered by whatever
// the ledger holds. Nothing failed: the try is not counted.
func (d *delivery) unsentOnLostClaim(err error) verdict {
	d.w.log.WarnContext(d.ctx, "the claim lapsed before the call was sent; not sending it", d.attrs("error", err)...)
	o := retryUncounted(d.w.cfg.RetryDelay, err)
	o.label = OutcomeFenced
	return o
}

// runUnclaimed runs a tool without a ledger row. An uncertain outcome is
// retried: the call has no effect, or its downstream collapses a repeat.
func (d *delivery) runUnclaimed() verdict {
	d.noteFinding(ledgerNone, nil)
	if o, stop := d.stopCrashLoop(); stop {
		return o
	}
	keep := d.heartbeat(ledger.Fence{}, time.Now())
	out, result, te := d.runTool(0, keep)
	keep.stop()
	d.hook(DuringTool)
	r := jobs.NewResult(d.job, d.key, jobs.StatusOK)
	r.Attempts = d.deliveries
	label := OutcomeOK
	switch result {
	case tools.NotSent:
		return d.notSent(te, 0)
	case tools.Ambiguous:
		return retryAfter(d.delay(te), te)
	case tools.Definite:
		r.Status, r.Error, label = jobs.StatusError, &jobs.ResultError{Code: te.Code, Message: te.Message}, OutcomeError
	case tools.Success:
		r.Output = out
	}
	return d.publish(r, label)
}

// runTool runs the tool under a client span and classifies the outcome. A
// panicking executor is recovered and counts as ambiguous: the call may
// have taken effect.
func (d *delivery) runTool(attempt int64, keep *keepalive) (out json.RawMessage, result tools.Outcome, te *tools.Error) {
	ctx, span := d.child(d.startCtx, "execute_tool "+d.tool.Name, trace.SpanKindInternal, d.toolAttrs(attempt))
	defer span.End()
	start := time.Now()
	defer func() { d.w.observeTool(d, start, result) }()
	out, err := d.callTool(ctx, attempt, keep)
	result, te = tools.Classify(err)
	if span.IsRecording() {
		span.SetAttributes(tracing.KeyToolOutcome.String(result.String()))
	}
	if te != nil {
		if span.IsRecording() {
			span.SetAttributes(tracing.KeyErrorCode.String(te.Code))
		}
		if result != tools.Success {
			span.SetStatus(codes.Error, te.Code)
		}
	}
	return out, result, te
}

// callTool calls the executor, turning a panic into an ambiguous error.
func (d *delivery) callTool(ctx context.Context, attempt int64, keep *keepalive) (out json.RawMessage, err error) {
	defer func() {
		if p := recover(); p != nil {
			d.w.log.ErrorContext(d.ctx, "tool executor panicked; its outcome is unknown", d.attrs("panic", fmt.Sprint(p), "stack", string(debug.Stack()))...)
			out, err = nil, tools.AmbiguousError("panic", fmt.Sprintf("the executor panicked: %v", p), 0, nil)
		}
	}()
	return d.tool.Run(ctx, d.request(attempt), tools.BeforeSend(keep.beforeSend))
}

// request is the call as an executor gets it.
func (d *delivery) request(attempt int64) tools.Request {
	return tools.Request{Tool: d.job.Tool, Key: d.key, Args: d.material.Canonical, ToolUseID: d.job.ToolUseID,
		ConversationID: d.job.ConversationID, TurnIndex: d.job.TurnIndex, Attempt: attempt}
}

// resultOf is the result of this job as the ledger row records it: a
// duplicate when the row was claimed by another tool_use_id.
func (d *delivery) resultOf(row ledger.Row) *jobs.Result {
	r := jobs.NewResult(d.job, d.key, jobs.StatusOK)
	r.Attempts = int(row.Attempt)
	r.CompletedAt = row.UpdatedAt
	switch row.State {
	case ledger.Completed:
		r.Output = row.Result
	case ledger.Failed:
		r.Status = jobs.StatusError
		switch row.ApprovalStatus {
		case ledger.ApprovalDenied:
			r.Status = jobs.StatusDenied
		case ledger.ApprovalExpired:
			r.Status = jobs.StatusExpired
		}
	case ledger.Indeterminate:
		r.Status = jobs.StatusIndeterminate
	}
	r.Approval = approvals.Result(row)
	if row.Error != nil && row.State != ledger.Completed {
		r.Error = &jobs.ResultError{Code: row.Error.Code, Message: row.Error.Message}
	}
	if row.FirstToolUseID != d.job.ToolUseID {
		r.Duplicate, r.OriginalToolUseID = true, row.FirstToolUseID
	}
	return r
}

// notSent hands back a call that never reached its downstream. It counts
// toward the delivery limit only when the downstream refused it: a call
// held back by an open circuit breaker (which other calls' failures
// opened), or by the drain, did not fail. An open breaker's wait is what
// remains of its open period.
func (d *delivery) notSent(te *tools.Error, tries int64) verdict {
	if d.heldBack(te) {
		return retryUncounted(d.delay(te), te)
	}
	o := retryAfter(d.delay(te), te)
	o.tries = tries
	return o
}

// heldBack reports a call that was not sent for no fault of its own: the
// drain started, or its downstream's breaker (opened by other calls) refused
// it.
func (d *delivery) heldBack(te *tools.Error) bool {
	return d.startCtx.Err() != nil || errors.Is(te, tools.ErrBreakerOpen)
}

// failedTry records on the row that this try of the call failed, and
// returns how many have. At the delivery limit the job goes to the DLQ
// (settle), and the count starts again, so that an operator's requeue gets
// the call a full set of tries.
func (d *delivery) failedTry(ctx context.Context, row ledger.Row) (int64, error) {
	try, record := d.w.limit.failure(row.Failures)
	err := d.durably(ctx, "count the failure", func() error { return d.w.cfg.Ledger.CountFailures(ctx, row.Fence(), record) })
	return try, err
}

// breakerOpen answers a call whose downstream's breaker is open without
// claiming it: from the ledger when another delivery settled it, else by
// handing it back, uncounted, for when the open period ends.
func (d *delivery) breakerOpen(wait time.Duration) verdict {
	// A claim would have recorded the answer, which retention counts from:
	// this job can come back (a replay) as long as the row. It is recorded
	// before the row is read, so that a row read is one a purge can no
	// longer take (a purge that took it first leaves nothing to read).
	if err := d.w.cfg.Ledger.Answered(d.runCtx, d.key); err != nil {
		return retryUncounted(wait, fmt.Errorf("record the answer behind an open breaker: %w", err))
	}
	row, err := d.w.cfg.Ledger.Get(d.runCtx, d.key)
	if err == nil && (row.State == ledger.Completed || row.State == ledger.Failed || row.State == ledger.Indeterminate) {
		if claim := d.w.claimOf(d); !claim.SameCall(&row) {
			return d.collision(fmt.Errorf("%w: %s", ledger.ErrMaterialMismatch, d.key))
		}
		return d.duplicate(row, ledgerDuplicate)
	}
	return retryUncounted(wait, fmt.Errorf("the circuit breaker for %s is open", d.tool.Downstream))
}

// stopCrashLoop stops a job of a tool without a ledger row that keeps
// stopping its worker, before it runs again: a process that dies never
// reaches settle, so nothing else counts these deliveries (see
// deliveryLimit). Calls with a row count their tries on it instead: see
// takeOver.
func (d *delivery) stopCrashLoop() (verdict, bool) {
	if why := d.w.limit.crashLooping(d.countedDeliveries()); why != nil {
		return deadLettered(jobs.DLQMaxDeliver, why), true
	}
	return verdict{}, false
}

// countedDeliveries is how many deliveries of this message count toward the
// limit (deliveryLimit.deliveries).
func (d *delivery) countedDeliveries() int {
	if d.meta == nil {
		return d.deliveries
	}
	return d.w.limit.deliveries(d.meta.Sequence.Stream, d.deliveries)
}

// lostClaim handles a refused write after the tool ran: another attempt
// owns the key now (this delivery's lease expired and was taken over). This
// zombie publishes nothing; the job comes back and is answered from the
// ledger.
func (d *delivery) lostClaim(err error) verdict {
	if isFenced(err) {
		d.w.log.WarnContext(d.ctx, "lost the claim while the tool ran; publishing nothing", d.attrs("error", err)...)
		o := retryAfter(d.w.cfg.RetryDelay, err)
		o.label = OutcomeFenced
		return o
	}
	return retryAfter(d.w.backoff(d), err)
}

// lostRace handles a takeover that another worker won, or a lease renewed
// meanwhile: look again soon.
func (d *delivery) lostRace(err error) verdict {
	if isFenced(err) || errors.Is(err, ledger.ErrLeaseHeld) { // not this job failing
		return retryUncounted(200*time.Millisecond, err)
	}
	return retryAfter(d.w.backoff(d), err)
}

// delay is the tool's retry hint, or the worker's backoff.
func (d *delivery) delay(te *tools.Error) time.Duration {
	if te != nil && te.RetryAfter > 0 {
		return te.RetryAfter
	}
	return d.w.backoff(d)
}

// hook calls the test hook at a fault point.
func (d *delivery) hook(p FaultPoint) {
	if h := d.w.cfg.Test.Hook; h != nil && d.job != nil {
		h(p, d.job)
	}
}

func (d *delivery) attrs(more ...any) []any {
	a := []any{"deliveries", d.deliveries}
	if d.meta != nil {
		a = append(a, "stream_seq", d.meta.Sequence.Stream)
	}
	if d.job != nil {
		a = append(a, "key", d.key, "tool", d.job.Tool, "tool_use_id", d.job.ToolUseID)
	}
	return append(a, more...)
}

// isFenced reports a write refused because another attempt owns the key.
func isFenced(err error) bool {
	return errors.Is(err, ledger.ErrFenced) || errors.Is(err, ledger.ErrNotFound)
}

// infoOf is what the ledger records of a tool's error: its code, and its
// message cut to 4 KiB (an executor's message has no bound of its own).
func infoOf(te *tools.Error) ledger.ErrorInfo {
	if te == nil {
		return ledger.ErrorInfo{Code: "unknown"}
	}
	return ledger.ErrorInfo{Code: cut(te.Code, 256), Message: cut(te.Message, 4<<10)}
}
