package worker

// Approvals (docs/approvals.md): a call whose tool's policy asks for a
// person is claimed as any other, then waits in the ledger instead of
// running; the delivery is answered at once with a pending result and
// acknowledged. A duplicate meanwhile joins the waiters and gets the same
// pending answer. Once decided, the call's job is published again
// (approvals.Service): its delivery claims the released row of an
// approved call and runs it once, or finds the denied or expired row
// settled, and answers every waiter.

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tracing"
)

// OutcomeAwaitingApproval: the call waits for a person's decision; its
// delivery was answered with a pending result and nothing ran.
const OutcomeAwaitingApproval Outcome = "awaiting_approval"

// OutcomeDecided: the job toolq published again for a decided call was
// answered from its denied or expired row; nothing ran, and it is no
// duplicate of anything an agent sent.
const OutcomeDecided Outcome = "decided"

// decided reports whether the delivery is of a job toolq published again
// once its call was decided (approvals.Service).
func (d *delivery) decided() bool { return d.msg.Headers().Get(jobs.HeaderApproval) != "" }

// approvalRoom is how large the canonical args of a call that waits for
// approval may be: they travel whole in the job published again to run it,
// which must fit the body limit, and, with the decision, in the approval
// events and the results, which must fit the broker's payload.
func (d *delivery) approvalRoom() int {
	return min(d.w.cfg.MaxBodySize, int(d.w.cfg.JS.Conn().MaxPayload())-resultEnvelope-decisionRoom) - 2<<10
}

// decisionRoom bounds what a decision adds to its call's events and
// results: who decided and why (ledger.Decision.Check), each escaped in
// JSON at worst sixfold (a control character is \u00XX).
const decisionRoom = 6 * (ledger.MaxDecisionBy + ledger.MaxDecisionReason)

// needsApproval reports whether the claimed call must wait for a person
// before it runs: its tool has a policy that asks for these args, and no
// person has approved it yet (an approved call released for a retry does
// not ask again).
func (d *delivery) needsApproval(row ledger.Row) bool {
	a := d.tool.Approval
	if a == nil || row.ApprovalStatus != "" {
		return false
	}
	need, err := a.Needed(d.job.Args)
	if err != nil {
		d.w.log.WarnContext(d.ctx, "the approval policy could not be evaluated; the call waits for a person", d.attrs("error", err)...)
	}
	return need
}

// requestApproval turns the claimed row into one awaiting approval, with
// the canonical args that will run, and answers the delivery pending.
func (d *delivery) requestApproval(row ledger.Row) verdict {
	ctx, span := d.child(d.runCtx, "toolq.approval request", trace.SpanKindClient, d.w.ledgerAttrs("await_approval"))
	defer span.End()
	if n := len(d.material.Canonical); n > d.approvalRoom() {
		// Asked for, it could never be answered nor run: say so now.
		info := ledger.ErrorInfo{Code: "args_too_large_for_approval", Message: fmt.Sprintf(
			"the call needs a person's approval, and its args (%d bytes canonical) exceed the %d bytes an approval can carry; it did not run", n, d.approvalRoom())}
		if err := d.durably(ctx, "fail", func() error { return d.w.cfg.Ledger.Fail(ctx, row.Fence(), info) }); err != nil {
			return d.lostClaim(err)
		}
		row.State, row.Error = ledger.Failed, &info
		return d.answer(row, OutcomeError)
	}
	sc := d.span.SpanContext()
	info := ledger.ApprovalInfo{Args: d.material.Canonical, Group: d.tool.Approval.Group, TTL: d.tool.Approval.TTL,
		RequestedAt: time.Now().UTC().Truncate(time.Millisecond), TraceID: sc.TraceID().String(), SpanID: sc.SpanID().String()}
	var got ledger.Row
	err := d.durably(ctx, "await approval", func() (err error) {
		got, err = d.w.cfg.Ledger.AwaitApproval(ctx, row.Fence(), info, d.job.ToolUseID)
		return err
	})
	if err != nil {
		span.RecordError(err)
		return d.lostClaim(err)
	}
	d.w.approvals.CountRequested(d.ctx)
	d.w.log.InfoContext(d.ctx, "the call waits for a person's approval", d.attrs("group", info.Group, "expires_at", got.ApprovalExpiresAt)...)
	d.hook(AfterApprovalRequest)
	return d.pending(got)
}

// pending answers a delivery of a call awaiting approval: its tool_use_id
// joins the waiters, the request is published on the approvals stream if
// no delivery did yet, and the result says awaiting_approval.
func (d *delivery) pending(row ledger.Row) verdict {
	if !slices.Contains(row.Waiters, d.job.ToolUseID) {
		err := d.durably(d.runCtx, "add waiter", func() (err error) {
			row, err = d.w.cfg.Ledger.AddWaiter(d.runCtx, d.key, d.job.ToolUseID)
			return err
		})
		switch {
		case errors.Is(err, ledger.ErrNotAwaiting), errors.Is(err, ledger.ErrNotFound): // decided meanwhile: look again
			return retryUncounted(100*time.Millisecond, fmt.Errorf("the approval was decided meanwhile: %w", err))
		case err != nil:
			return retryUncounted(d.w.backoff(d), fmt.Errorf("add waiter: %w", err))
		}
	}
	if row.Approval != nil && !row.Approval.Published {
		err := d.durably(d.runCtx, "publish the approval request", func() error {
			err := d.w.approvals.Requested(d.ctx, row)
			if err != nil && !errors.Is(err, ledger.ErrUnavailable) && !refused(err) && !tooLarge(err) {
				return &brokerError{err}
			}
			return err
		})
		switch {
		case err == nil:
		case transient(err):
			return retryUncounted(d.w.backoff(d), err)
		default:
			return retryAfter(d.w.backoff(d), err)
		}
	}
	r := jobs.NewResult(d.job, d.key, jobs.StatusAwaitingApproval)
	r.Attempts, r.CompletedAt = int(row.Attempt), row.UpdatedAt
	r.Approval = approvals.Result(row)
	if row.FirstToolUseID != d.job.ToolUseID {
		r.Duplicate, r.OriginalToolUseID = true, row.FirstToolUseID
	}
	if d.span.IsRecording() {
		d.span.SetAttributes(tracing.KeyResultStatus.String(string(r.Status)))
	}
	return d.publish(r, OutcomeAwaitingApproval)
}

// answer publishes the result of a settled row to this delivery's
// tool_use_id and then, for a call that waited for approval, to every
// other tool_use_id that asked meanwhile, and records them answered.
func (d *delivery) answer(row ledger.Row, label Outcome) verdict {
	v := d.publish(d.resultOf(row), label)
	if v.verb != verbAck || len(row.Waiters) == 0 {
		return v
	}
	for _, id := range row.Waiters {
		if id == d.job.ToolUseID {
			continue
		}
		if err := d.publishTo(row, id); err != nil {
			if transient(err) {
				return retryUncounted(d.w.backoff(d), fmt.Errorf("answer waiter %s: %w", id, err))
			}
			return retryAfter(d.w.backoff(d), fmt.Errorf("answer waiter %s: %w", id, err))
		}
	}
	if err := d.durably(d.runCtx, "waiters answered", func() error { return d.w.cfg.Ledger.WaitersAnswered(d.runCtx, d.key) }); err != nil {
		d.w.log.WarnContext(d.ctx, "the waiters are answered but the ledger could not record it; the sweep answers them again", d.attrs("error", err)...)
	}
	return v
}

// publishTo publishes the result of a settled row to waiter, a tool_use_id
// that asked while the call awaited approval.
func (d *delivery) publishTo(row ledger.Row, waiter string) error {
	r := d.resultOf(row)
	r.ToolUseID = waiter
	r.Duplicate, r.OriginalToolUseID = waiter != row.FirstToolUseID, ""
	if r.Duplicate {
		r.OriginalToolUseID = row.FirstToolUseID
	}
	subject := jobs.TenantResultSubject(d.job.Tenant, d.job.ConversationID)
	msg := nats.NewMsg(subject)
	msg.Header.Set(jobs.HeaderKey, d.key)
	msg.Header.Set(jetstream.MsgIDHeader, jobs.ResultMsgID(d.key, waiter, answerID(r, true, d.jobSeq())))
	d.w.propagator.Inject(d.ctx, jobs.HeaderCarrier(msg.Header))
	return d.sendResult(d.runCtx, msg, r)
}

// refuseDecided settles a decided call whose job, published again to run
// it, was refused before its claim (its tool left the registry, its args no
// longer pass the schema): the approved call cannot run, so it fails with
// the refusal, and every tool_use_id that asked gets that answer, once.
func (d *delivery) refuseDecided(r *refusal) verdict {
	info := ledger.ErrorInfo{Code: r.code, Message: "the approved call cannot run: " + r.message}
	var row ledger.Row
	err := d.durably(d.runCtx, "fail the approved call", func() (err error) {
		row, err = d.w.cfg.Ledger.FailApproved(d.runCtx, d.key, info)
		return err
	})
	if err != nil {
		return retryUncounted(d.w.backoff(d), fmt.Errorf("fail the approved call: %w", err))
	}
	d.w.log.WarnContext(d.ctx, "an approved call cannot run; every tool_use_id that asked is told", d.attrs("code", r.code, "reason", r.message)...)
	return d.answer(row, OutcomeRejected)
}

// answerDeadLettered tells every tool_use_id that asked for a decided call
// that its run was dead-lettered, when the job toolq published to run it
// ends in the DLQ: a result each (error, dead_lettered), so that no agent
// is left with the pending answer. Nothing is recorded in the ledger: a
// requeue of the dead letter runs the call, and its result supersedes this
// one. A call its sweep would publish again (never claimed since the
// decision) is failed instead, so that it is not published for ever.
func (d *delivery) answerDeadLettered(o verdict) {
	if d.job == nil || d.key == "" {
		return
	}
	row, err := d.w.cfg.Ledger.ApprovedNotRun(d.runCtx, d.key)
	if err != nil {
		return // settled (its answer stands), or gone
	}
	info := ledger.ErrorInfo{Code: "dead_lettered", Message: fmt.Sprintf(
		"the approved call's job went to the dead-letter stream (%s: %v); an operator can requeue it", o.reason, o.err)}
	if row.Attempt <= row.ApprovalAttempt { // never claimed since the decision: it could never run
		if failed, err := d.w.cfg.Ledger.FailApproved(d.runCtx, d.key, info); err == nil {
			row = failed
		}
	} else {
		row.State, row.Error = ledger.Failed, &info
	}
	for _, id := range row.Waiters {
		if err := d.publishTo(row, id); err != nil {
			d.w.log.WarnContext(d.ctx, "could not tell a waiter that the approved call was dead-lettered", d.attrs("waiter", id, "error", err)...)
		}
	}
	if row.State == ledger.Failed && row.ApprovalStatus == ledger.ApprovalApproved && len(row.Waiters) > 0 {
		_ = d.w.cfg.Ledger.WaitersAnswered(d.runCtx, d.key)
	}
}
