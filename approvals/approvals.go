// Package approvals is toolq's approval step: a call whose tool's policy
// asks for a person waits in the ledger (ledger.AwaitingApproval) until
// someone decides. Service records decisions, publishes what happened on
// the approvals stream, and publishes the call's job again once it is
// decided, so that a worker runs an approved call once, under its key, or
// answers every tool_use_id that asked with the denial or the expiry. Its
// sweep (Run) expires undecided calls and finishes what a stopped process
// left half done. The worker, the decision service on toolq.decide.<group>
// (Serve), the CLI and the approvals inbox all decide through it.
package approvals

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tracing"
)

// Config configures a Service.
type Config struct {
	Ledger *ledger.Store
	// JS publishes approval events and the jobs of decided calls. Without
	// it (a CLI that cannot reach NATS) decisions are recorded in the
	// ledger, and the sweep of a running consumer publishes them.
	JS     jetstream.JetStream
	Logger *slog.Logger
	// TracerProvider, MeterProvider and Propagator default to OpenTelemetry's
	// globals.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagator     propagation.TextMapPropagator
	// Unanswered is how long a decided call may have waiters without their
	// final answer before the sweep publishes its job again (default 30s).
	Unanswered time.Duration
	// Tenants are the tenants besides the default one (docs/tenants.md).
	// A call's tenant is the one whose key its row's key is: its events
	// and its decided job go on that tenant's subjects, and only that
	// tenant's decision subject decides it.
	Tenants []string
}

// Service decides calls awaiting approval. Its methods are safe for
// concurrent use.
type Service struct {
	cfg     Config
	log     *slog.Logger
	tracer  trace.Tracer
	metrics instruments

	sweepMu    sync.Mutex
	sweepAfter string // the key of the unanswered call the last sweep stopped at
}

type instruments struct {
	events     metric.Int64Counter
	decideTime metric.Float64Histogram
}

// Attribute of the toolq.approvals metric: requested, approved, denied,
// expired.
var keyEvent = attribute.Key("toolq.approval.event")

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Ledger == nil {
		return nil, errors.New("approvals: a ledger is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.Propagator == nil {
		cfg.Propagator = otel.GetTextMapPropagator()
	}
	if cfg.Unanswered <= 0 {
		cfg.Unanswered = 30 * time.Second
	}
	s := &Service{cfg: cfg, log: cfg.Logger, tracer: cfg.TracerProvider.Tracer("github.com/toolq/toolq/approvals")}
	m := cfg.MeterProvider.Meter("github.com/toolq/toolq/approvals")
	var err error
	if s.metrics.events, err = m.Int64Counter("toolq.approvals", metric.WithUnit("{call}"),
		metric.WithDescription("Calls that asked for approval, and decisions, by event (toolq.approval.event): requested, approved, denied, expired.")); err != nil {
		return nil, err
	}
	if s.metrics.decideTime, err = m.Float64Histogram("toolq.approval.decision.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a call's approval request to its decision (approved, denied or expired), by event."),
		metric.WithExplicitBucketBoundaries(1, 10, 30, 60, 300, 900, 1800, 3600, 4*3600, 12*3600, 24*3600, 7*24*3600)); err != nil {
		return nil, err
	}
	return s, nil
}

// Requested publishes the approval request of a call that has just turned
// awaiting (row), on toolq.approvals.<conversation_id>, once: it is
// recorded in the row, and a duplicate of the call does not publish it
// again. ctx carries the span that asked.
func (s *Service) Requested(ctx context.Context, row ledger.Row) error {
	if row.Approval == nil || row.Approval.Published {
		return nil
	}
	if s.cfg.JS == nil {
		return errors.New("approvals: no NATS connection to publish the request")
	}
	if err := s.publishEvent(ctx, row, jobs.ApprovalRequested); err != nil {
		return err
	}
	return s.cfg.Ledger.ApprovalPublished(ctx, row)
}

// CountRequested counts a call that asked for approval.
func (s *Service) CountRequested(ctx context.Context) {
	s.metrics.events.Add(ctx, 1, metric.WithAttributes(keyEvent.String(jobs.ApprovalRequested)))
}

// Decide records a person's decision on the call key (ledger.Store.Decide)
// under a span of its own, linked to the span that asked, and announces it:
// the decision event on the approvals stream, and the call's job published
// again, whose delivery runs the approved call once or answers every
// tool_use_id that asked. A decision recorded but not announced (NATS out)
// is announced by the sweep. Errors are the ledger's.
func (s *Service) Decide(ctx context.Context, key string, d ledger.Decision) (ledger.Row, error) {
	status := "deny"
	if d.Approve {
		status = "approve"
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		tracing.KeyKey.String(key), attribute.String("toolq.approval.by", d.By), attribute.String("toolq.approval.decision", status))}
	if sc := s.requestSpan(ctx, key); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{tracing.KeyLink.String("approval_request")}}))
	}
	ctx, span := s.tracer.Start(ctx, "toolq.approval "+status, opts...)
	defer span.End()
	row, err := s.cfg.Ledger.Decide(ctx, key, d)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "refused")
		return row, err
	}
	span.SetAttributes(tracing.KeyTool.String(row.Tool), tracing.KeyConversation.String(row.ConversationID),
		attribute.String("toolq.approval.group", groupOf(row)))
	s.counted(ctx, row)
	s.log.InfoContext(ctx, "approval decided", "key", key, "decision", row.ApprovalStatus, "by", d.By, "reason", d.Reason, "tool", row.Tool)
	if err := s.announce(ctx, row); err != nil {
		s.log.WarnContext(ctx, "decision recorded; announcing it failed, the sweep will", "key", key, "error", err)
	}
	return row, nil
}

// counted records a decision's metrics.
func (s *Service) counted(ctx context.Context, row ledger.Row) {
	event := string(row.ApprovalStatus)
	s.metrics.events.Add(ctx, 1, metric.WithAttributes(keyEvent.String(event)))
	if row.Approval != nil && !row.Approval.RequestedAt.IsZero() {
		s.metrics.decideTime.Record(ctx, time.Since(row.Approval.RequestedAt).Seconds(), metric.WithAttributes(keyEvent.String(event)))
	}
}

// requestSpan is the span that asked for key's approval, from its row.
func (s *Service) requestSpan(ctx context.Context, key string) trace.SpanContext {
	row, err := s.cfg.Ledger.Get(ctx, key)
	if err != nil || row.Approval == nil {
		return trace.SpanContext{}
	}
	tid, err1 := trace.TraceIDFromHex(row.Approval.TraceID)
	sid, err2 := trace.SpanIDFromHex(row.Approval.SpanID)
	if err1 != nil || err2 != nil {
		return trace.SpanContext{}
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}

// announce publishes a decided call's event and its job again.
func (s *Service) announce(ctx context.Context, row ledger.Row) error {
	if s.cfg.JS == nil {
		return errors.New("no NATS connection")
	}
	if err := s.publishEvent(ctx, row, string(row.ApprovalStatus)); err != nil {
		return err
	}
	return s.publishJob(ctx, row)
}

// Sweep expires the calls whose approval ran out undecided (they never run)
// and announces them, then announces again every decided call whose
// waiters still lack their final answer after Unanswered: a process
// stopped between the decision and the answers. It reads at most a
// thousand of those, and the next sweep goes on from where it stopped. It
// returns how many calls it expired and announced again.
func (s *Service) Sweep(ctx context.Context) (expired, again int, err error) {
	for {
		rows, err := s.cfg.Ledger.ExpireApprovals(ctx, 100)
		if err != nil {
			return expired, again, err
		}
		for _, row := range rows {
			s.counted(ctx, row)
			s.log.InfoContext(ctx, "approval expired; the call will not run", "key", row.Key, "tool", row.Tool)
			if err := s.announce(ctx, row); err != nil {
				s.log.WarnContext(ctx, "announcing an expiry failed; the sweep will again", "key", row.Key, "error", err)
			}
		}
		expired += len(rows)
		if len(rows) < 100 {
			break
		}
	}
	if s.cfg.JS == nil {
		return expired, 0, nil
	}
	// The unanswered calls, a page at a time, up to sweepPages of them:
	// calls this consumer cannot announce (another tenant's, or a call
	// that fails) must not hold up those after them, and the next sweep
	// goes on where this one stopped, so that each call is reached.
	s.sweepMu.Lock()
	after := s.sweepAfter
	s.sweepMu.Unlock()
	var failed error
	for range sweepPages {
		rows, err := s.cfg.Ledger.UnansweredApprovals(ctx, s.cfg.Unanswered, after, sweepPage)
		if err != nil {
			return expired, again, err
		}
		for _, row := range rows {
			if err := s.announce(ctx, row); err != nil {
				s.log.WarnContext(ctx, "announcing a decided call again failed; the next sweep tries again", "key", row.Key, "error", err)
				failed = err
				continue
			}
			again++
		}
		if len(rows) < sweepPage {
			after = "" // the last page: the next sweep starts from the first
			break
		}
		after = rows[len(rows)-1].Key
	}
	s.sweepMu.Lock()
	s.sweepAfter = after
	s.sweepMu.Unlock()
	return expired, again, failed
}

// A sweep reads the unanswered calls sweepPage at a time, sweepPages pages
// at most.
const sweepPage, sweepPages = 100, 10

// Run sweeps every interval until ctx ends.
func (s *Service) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "approvals sweep failed; trying again", "error", err, "in", interval)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// publishEvent publishes one event of row on the approvals stream, once
// (its message id is the key's and the event's).
func (s *Service) publishEvent(ctx context.Context, row ledger.Row, event string) error {
	ev := Event(row, event)
	body, err := encode(ev)
	if err != nil {
		return err
	}
	tenant, err := s.TenantOf(row)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(jobs.TenantApprovalSubject(tenant, row.ConversationID))
	msg.Data = body
	msg.Header.Set(jetstream.MsgIDHeader, jobs.ApprovalEventMsgID(row.Key, event))
	msg.Header.Set(jobs.HeaderKey, row.Key)
	s.cfg.Propagator.Inject(ctx, jobs.HeaderCarrier(msg.Header))
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.cfg.JS.PublishMsg(pctx, msg); err != nil {
		return fmt.Errorf("approvals: publish the %s event of %s: %w", event, row.Key, err)
	}
	return nil
}

// publishJob publishes the job of a decided call again, with the first
// tool_use_id that asked: its delivery finds the row approved (and runs
// it) or settled (and answers from it), and answers every waiter. Its
// message id names the decision and the attempt, so that JetStream drops
// the sweep's repeats inside its duplicate window.
func (s *Service) publishJob(ctx context.Context, row ledger.Row) error {
	if row.Approval == nil {
		return fmt.Errorf("approvals: %s holds no approval to run", row.Key)
	}
	tenant, err := s.TenantOf(row)
	if err != nil {
		return err
	}
	job := jobs.Job{Version: jobs.Version, ConversationID: row.ConversationID, TurnIndex: row.TurnIndex, Ordinal: row.Ordinal,
		Tool: row.Tool, ToolUseID: row.FirstToolUseID, Args: row.Approval.Args, Tenant: tenant}
	body, err := encode(job)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(jobs.TenantJobSubject(tenant, row.Tool))
	msg.Data = body
	id := decidedMsgID(row)
	msg.Header.Set(jetstream.MsgIDHeader, id)
	msg.Header.Set(jobs.HeaderKey, row.Key)
	msg.Header.Set(jobs.HeaderApproval, string(row.ApprovalStatus))
	s.cfg.Propagator.Inject(ctx, jobs.HeaderCarrier(msg.Header))
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ack, err := s.cfg.JS.PublishMsg(pctx, msg)
	if err != nil {
		return fmt.Errorf("approvals: publish the job of %s again: %w", row.Key, err)
	}
	if ack.Duplicate && len(s.cfg.Tenants) > 0 && !s.ownJob(pctx, ack.Sequence, msg) {
		// Tenants share TOOLQ_JOBS's duplicate window: the message that
		// took the id is not this job's (a tenant published it, on its own
		// subject). Publish it under an id no one can have taken; a second
		// delivery of a decided call is answered from its row.
		nonce := make([]byte, 12)
		if _, err := rand.Read(nonce); err != nil {
			return fmt.Errorf("approvals: publish the job of %s again: %w", row.Key, err)
		}
		msg.Header.Set(jetstream.MsgIDHeader, id+":"+hex.EncodeToString(nonce))
		if _, err := s.cfg.JS.PublishMsg(pctx, msg); err != nil {
			return fmt.Errorf("approvals: publish the job of %s again: %w", row.Key, err)
		}
	}
	return nil
}

// decidedMsgID is the Nats-Msg-Id of a decided call's job:
// decided:<key>:<status>:<attempt>:<the decision's time in Unix ns>. The
// same for every publication of one decision (the sweep's repeats, by any
// consumer), so that JetStream drops them inside its duplicate window; the
// decision's time is in it so that another tenant, sharing that window,
// cannot easily take it first.
func decidedMsgID(row ledger.Row) string {
	var at int64
	if d := row.LastDecision(); d != nil {
		at = d.At.UnixNano()
	}
	return "decided:" + row.Key + ":" + string(row.ApprovalStatus) + ":" + strconv.FormatInt(row.Attempt, 10) + ":" + strconv.FormatInt(at, 10)
}

// ownJob reports whether the message at seq in TOOLQ_JOBS, the one a
// publication of msg was dropped as a duplicate of, is msg's job: on its
// subject, a tenant's own, under its key. Unreadable, it is taken as not.
func (s *Service) ownJob(ctx context.Context, seq uint64, msg *nats.Msg) bool {
	m, err := jsretry.Do(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		stream, err := s.cfg.JS.Stream(ctx, jobs.JobsStream)
		if err != nil {
			return nil, err
		}
		return stream.GetMsg(ctx, seq)
	})
	return err == nil && m.Subject == msg.Subject && m.Header.Get(jobs.HeaderKey) == msg.Header.Get(jobs.HeaderKey) &&
		m.Header.Get(jetstream.MsgIDHeader) == msg.Header.Get(jetstream.MsgIDHeader)
}

// TenantOf returns the tenant of a row that holds an approval: the one,
// of the default tenant and Config.Tenants, whose key of the row's call
// (its conversation, turn, tool, ordinal and approval's args) is the
// row's key (or its legacy key); without tenants configured, the default
// tenant's call's only. Rows without an approval,
// and rows of no tenant configured, are an error: their events and job
// are then not published, and the sweep of a consumer that serves the
// tenant publishes them.
func (s *Service) TenantOf(row ledger.Row) (string, error) {
	if row.Approval == nil {
		return "", fmt.Errorf("approvals: %s holds no approval", row.Key)
	}
	// Without tenants configured too: a process that does not know the
	// tenants (`consumer approve` that found no tenants' streams, a consumer
	// run without --tenants on a shared ledger) must not announce a
	// tenant's call as the default tenant's.
	for _, t := range append([]string{""}, s.cfg.Tenants...) {
		c := jobs.Call{Tenant: t, ConversationID: row.ConversationID, TurnIndex: row.TurnIndex, Tool: row.Tool, Ordinal: row.Ordinal, Args: row.Approval.Args}
		m, err := c.Material()
		if err != nil {
			continue
		}
		if m.Key() == row.Key {
			return t, nil
		}
		if l, ok := m.Legacy(); ok && l.Key() == row.Key {
			return t, nil
		}
	}
	// Never announced on another tenant's subjects: a running consumer
	// that serves the call's tenant announces it (its sweep).
	return "", fmt.Errorf("approvals: %s is the key of no configured tenant's call (a consumer run with --tenants serves the tenants)", row.Key)
}

// Event is the approvals stream's event of row.
func Event(row ledger.Row, event string) jobs.ApprovalEvent {
	ev := jobs.ApprovalEvent{Version: jobs.Version, Event: event, Key: row.Key, ConversationID: row.ConversationID,
		TurnIndex: row.TurnIndex, Ordinal: row.Ordinal, Tool: row.Tool, ToolUseID: row.FirstToolUseID,
		ArgsDigest: row.ArgsDigest, ExpiresAt: row.ApprovalExpiresAt}
	if a := row.Approval; a != nil {
		ev.Args, ev.Group, ev.RequestedAt = a.Args, a.Group, a.RequestedAt
	}
	if d := row.LastDecision(); d != nil && event != jobs.ApprovalRequested {
		ev.By, ev.Reason, ev.DecidedAt = d.By, d.Reason, d.At
	}
	return ev
}

// Result is what a result says of the approval of row's call, or nil for a
// call that never needed one.
func Result(row ledger.Row) *jobs.ResultApproval {
	if row.ApprovalStatus == "" || row.Approval == nil {
		return nil
	}
	a := row.Approval
	r := &jobs.ResultApproval{Args: a.Args, ArgsDigest: row.ArgsDigest, Group: a.Group, RequestedAt: a.RequestedAt, ExpiresAt: row.ApprovalExpiresAt}
	if row.ApprovalStatus != ledger.ApprovalAwaiting {
		r.Decision = string(row.ApprovalStatus)
		if d := row.LastDecision(); d != nil {
			r.DecidedBy, r.Reason, r.DecidedAt = d.By, d.Reason, d.At
		}
	}
	return r
}

func groupOf(row ledger.Row) string {
	if row.Approval == nil {
		return ""
	}
	return row.Approval.Group
}

// encode marshals v without escaping HTML characters (args are published
// as they were canonicalized).
func encode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
