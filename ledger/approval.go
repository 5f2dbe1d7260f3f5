package ledger

// The ledger: approvals. A call whose tool needs a person's approval is
// claimed as any other; its holder then turns the row to awaiting_approval
// (AwaitApproval) with the canonical args that will run. A decision
// (Decide) approves it, and the row is released to run at its next claim
// without asking again, or denies it, and the row fails; one left waiting
// past its expiry is expired (ExpireApprovals) and fails. Exactly one
// decision stands: each is a compare-and-set on the awaiting row. The
// tool_use_ids that asked meanwhile are the row's waiters, emptied
// (WaitersAnswered) once each has its final answer.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// ApprovalStatus is where a call's approval is.
type ApprovalStatus string

// The approval statuses of a row (Row.ApprovalStatus); "" for a call that
// never needed one.
const (
	ApprovalAwaiting ApprovalStatus = "awaiting"
	ApprovalApproved ApprovalStatus = "approved"
	ApprovalDenied   ApprovalStatus = "denied"
	ApprovalExpired  ApprovalStatus = "expired"
)

// The error codes of a call that was denied or expired (Row.Error.Code).
const (
	CodeApprovalDenied  = "approval_denied"
	CodeApprovalExpired = "approval_expired"
)

// ApprovalInfo is what a call that needs approval asked for: the exact args
// that run if it is approved, and who may approve it.
type ApprovalInfo struct {
	Args        json.RawMessage `json:"args"`  // canonical (RFC 8785)
	Group       string          `json:"group"` // the approver group that may decide
	RequestedAt time.Time       `json:"requested_at"`
	TTL         time.Duration   `json:"ttl_ms"`
	// TraceID and SpanID name the span that asked, so that the decision's
	// span can link to it.
	TraceID string `json:"trace_id,omitempty"`
	SpanID  string `json:"span_id,omitempty"`
	// Published: the request is in the approvals stream
	// (ApprovalPublished), so that a duplicate does not publish it again.
	Published bool `json:"published,omitempty"`
}

// MarshalJSON writes TTL in milliseconds.
func (a ApprovalInfo) MarshalJSON() ([]byte, error) {
	type plain ApprovalInfo
	p := plain(a)
	p.TTL = a.TTL / time.Millisecond
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the args byte for byte
	if err := enc.Encode(p); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// UnmarshalJSON reads TTL in milliseconds.
func (a *ApprovalInfo) UnmarshalJSON(b []byte) error {
	type plain ApprovalInfo
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*a = ApprovalInfo(p)
	a.TTL = p.TTL * time.Millisecond
	return nil
}

// The longest name of who decided and reason that a decision takes, in
// bytes: both travel again, with the call's args, in the approval event
// and in every result of the call, which must fit the broker's payload.
const (
	MaxDecisionBy     = 256
	MaxDecisionReason = 2000
)

// Decision is a person's answer to a call awaiting approval.
type Decision struct {
	Approve bool
	By      string // who decided (required, at most MaxDecisionBy bytes)
	Reason  string // why (required, at most MaxDecisionReason bytes)
	// Group is the approver group the decision comes from: it must be the
	// call's. Empty: an operator's decision (the CLI), for any group.
	Group string
	// Digest, when set, is the args digest the approver saw: a call with
	// other args is not the one they decided on.
	Digest string
}

// Check returns ErrInvalidDecision for a decision that does not say who
// decided and why, or says it at more length than the call's event and
// results have room for; Decide refuses it so.
func (d Decision) Check() error {
	switch {
	case strings.TrimSpace(d.By) == "" || strings.TrimSpace(d.Reason) == "":
		return fmt.Errorf("%w: who decided and why are required: they are recorded with the decision", ErrInvalidDecision)
	case len(d.By) > MaxDecisionBy:
		return fmt.Errorf("%w: who decided: at most %d bytes, not %d", ErrInvalidDecision, MaxDecisionBy, len(d.By))
	case len(d.Reason) > MaxDecisionReason:
		return fmt.Errorf("%w: reason: at most %d bytes, not %d", ErrInvalidDecision, MaxDecisionReason, len(d.Reason))
	}
	return nil
}

// Decision returns the decision's Event.Decision.
func (d Decision) status() ApprovalStatus {
	if d.Approve {
		return ApprovalApproved
	}
	return ApprovalDenied
}

// groupPattern is what an approver group may be: a NATS subject token.
var groupPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidGroup reports whether name can be an approver group.
func ValidGroup(name string) bool { return groupPattern.MatchString(name) }

// LastDecision returns the event that decided the row's approval
// (approve, deny or expire), or nil.
func (r *Row) LastDecision() *Event {
	for i := len(r.History) - 1; i >= 0; i-- {
		switch r.History[i].Action {
		case "approve", "deny", "expire":
			return &r.History[i]
		}
	}
	return nil
}

func scanApproval(r *Row, status string, expiresMS int64, approval, waiters string) {
	r.ApprovalStatus = ApprovalStatus(status)
	r.ApprovalExpiresAt = time.Time{}
	if expiresMS > 0 {
		r.ApprovalExpiresAt = time.UnixMilli(expiresMS).UTC()
	}
	r.Approval = nil
	if approval != "" {
		r.Approval = new(ApprovalInfo)
		if json.Unmarshal([]byte(approval), r.Approval) != nil {
			r.Approval = nil
		}
	}
	r.Waiters = nil
	if waiters != "" && waiters != "[]" {
		_ = json.Unmarshal([]byte(waiters), &r.Waiters)
	}
}

// AwaitApproval turns the row of the claim f into awaiting_approval: the
// call has not run, and waits for a decision until ttl from now. toolUseID
// is its first waiter. Errors: ErrFenced when the claim is no longer f's.
func (s *Store) AwaitApproval(ctx context.Context, f Fence, info ApprovalInfo, toolUseID string) (Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	switch {
	case info.TTL < time.Millisecond:
		return Row{}, fmt.Errorf("ledger: await approval %q: a positive ttl is required", f.Key)
	case !ValidGroup(info.Group):
		return Row{}, fmt.Errorf("ledger: await approval %q: approver group %q is not a name of letters, digits, _ and -", f.Key, info.Group)
	}
	if err := checkOutput("await approval", f.Key, info.Args); err != nil {
		return Row{}, err
	}
	if info.RequestedAt.IsZero() {
		info.RequestedAt = time.Now().UTC().Truncate(time.Millisecond)
	}
	body, err := marshalApproval(info)
	if err != nil {
		return Row{}, fmt.Errorf("ledger: await approval %q: %w", f.Key, err)
	}
	waiters, _ := json.Marshal([]string{toolUseID})
	row, found, err := s.one(ctx, s.db.sql().awaitApproval,
		fenceArgs(f, namedArgs{"approval": string(body), "ttl_ms": info.TTL.Milliseconds(), "waiters": string(waiters)}))
	if err != nil {
		return Row{}, s.translate("await approval", err)
	}
	if !found {
		return Row{}, s.whyNot(ctx, "await approval", f)
	}
	return row, nil
}

// AddWaiter records toolUseID among the waiters of a call awaiting
// approval (a duplicate of it asked), and returns the row. Errors:
// ErrNotFound, ErrNotAwaiting (the call was decided meanwhile: answer from
// the row as it is now).
func (s *Store) AddWaiter(ctx context.Context, key, toolUseID string) (Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	row, found, err := s.one(ctx, s.db.sql().addWaiter, namedArgs{"key": key, "id": toolUseID})
	if err != nil {
		return Row{}, s.translate("add waiter", err)
	}
	if !found {
		return Row{}, s.notAwaiting(ctx, key)
	}
	return row, nil
}

// Decide records a person's decision on a call awaiting approval, in its
// history with who, when, why and the args digest: approved, the row is
// released and the call runs at its next claim; denied, the row fails with
// CodeApprovalDenied and the call never runs. It is a compare-and-set on
// the awaiting row, so of two decisions at once exactly one stands; the
// other gets ErrNotAwaiting, saying which stood. Errors: ErrNotFound;
// ErrNotAwaiting (decided, expired, or a call that never needed approval);
// ErrDecisionRefused (another group's call, another digest);
// ErrInvalidDecision (no by or reason, or one too long).
func (s *Store) Decide(ctx context.Context, key string, d Decision) (Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if err := d.Check(); err != nil {
		return Row{}, err
	}
	row, err := s.getAny(ctx, key)
	if err != nil {
		return Row{}, err
	}
	if row.State != AwaitingApproval {
		return Row{}, notAwaitingError(key, row)
	}
	group := ""
	if row.Approval != nil {
		group = row.Approval.Group
	}
	switch {
	case d.Group != "" && d.Group != group:
		return Row{}, fmt.Errorf("%w: %s needs an approver of group %q, not %q", ErrDecisionRefused, key, group, d.Group)
	case d.Digest != "" && d.Digest != row.ArgsDigest:
		return Row{}, fmt.Errorf("%w: %s has args digest %s, the decision names %s: it is not the call that was decided on",
			ErrDecisionRefused, key, row.ArgsDigest, d.Digest)
	}
	action := "deny"
	if d.Approve {
		action = "approve"
	}
	ev := Event{At: time.Now().UTC().Truncate(time.Millisecond), By: d.By, Action: action, Decision: string(d.status()),
		Reason: d.Reason, From: row.State, Digest: row.ArgsDigest, Group: group, Attempt: row.Attempt}
	evJSON, err := json.Marshal(ev)
	if err != nil {
		return Row{}, fmt.Errorf("ledger: decide %s: %w", key, err)
	}
	q, args := s.db.sql().deny, namedArgs{"key": key, "event": string(evJSON),
		"error": encodeError(ErrorInfo{Code: CodeApprovalDenied, Message: fmt.Sprintf("denied by %s: %s", d.By, d.Reason)})}
	if d.Approve {
		q = s.db.sql().approve
		delete(args, "error")
	}
	decided, found, err := s.one(ctx, q, args)
	if err != nil {
		return Row{}, s.translate("decide", err)
	}
	if !found { // decided or expired between the read and the update
		return Row{}, s.notAwaiting(ctx, key)
	}
	return decided, nil
}

// ExpireApprovals fails up to limit calls whose approval expired
// undecided, with CodeApprovalExpired, and returns them: they never run.
func (s *Store) ExpireApprovals(ctx context.Context, limit int) ([]Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ev, _ := json.Marshal(Event{At: time.Now().UTC().Truncate(time.Millisecond), By: "toolq", Action: "expire",
		Decision: string(ApprovalExpired), Reason: "no decision before the approval expired", From: AwaitingApproval})
	args := namedArgs{"limit": max(limit, 1), "event": string(ev),
		"error": encodeError(ErrorInfo{Code: CodeApprovalExpired, Message: "no decision before the approval expired; the call did not run"})}
	rows, err := s.rows(ctx, s.db.sql().expire, args)
	if err != nil {
		return nil, s.translate("expire approvals", err)
	}
	return rows, nil
}

// UnansweredApprovals returns up to limit calls that were decided (or,
// approved, ran) more than olderThan ago and still have waiters without
// their final answer: the consumer that decided or ran them stopped before
// answering them all. They come in the order of their keys, from the first
// after after ("": from the first): a reader pages on past the calls it
// cannot answer with the last key it read. An approved call released
// again after a claim (its downstream refused it) is not among them: its
// job is with JetStream's redeliveries and the delivery limit, as any
// call's.
func (s *Store) UnansweredApprovals(ctx context.Context, olderThan time.Duration, after string, limit int) ([]Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	rows, err := s.rows(ctx, s.db.sql().unanswered, namedArgs{"older_ms": olderThan.Milliseconds(), "after": after, "limit": max(limit, 1)})
	if err != nil {
		return nil, s.translate("unanswered approvals", err)
	}
	return rows, nil
}

// WaitersAnswered records that every waiter of a settled call has its
// final answer.
func (s *Store) WaitersAnswered(ctx context.Context, key string) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	_, err := s.db.exec(ctx, s.db.sql().waitersAnswered, namedArgs{"key": key})
	return s.translate("waiters answered", err)
}

// FailApproved settles an approved call that cannot run (the job toolq
// published to run it was refused before its claim: its tool left the
// registry, its args no longer pass the schema) as failed with info, and
// returns the row, so that its waiters are answered and it is not
// published again. A call no longer approved-and-released comes back as it
// is, unchanged.
func (s *Store) FailApproved(ctx context.Context, key string, info ErrorInfo) (Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	row, found, err := s.one(ctx, s.db.sql().failApproved, namedArgs{"key": key, "error": encodeError(info)})
	if err != nil {
		return Row{}, s.translate("fail approved", err)
	}
	if found {
		return row, nil
	}
	return s.getAny(ctx, key)
}

// ApprovalStatusOf is where the approval of key stands: the row's
// ApprovalStatus, and ApprovalExpired for a call still awaiting past its
// expiry (the sweep has not reached it), by the database's clock, which
// Decide reads: a call said to be expired can no longer be approved.
// Errors: ErrNotFound.
func (s *Store) ApprovalStatusOf(ctx context.Context, key string) (ApprovalStatus, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var status string
	var expired, found bool
	err := s.db.queryRows(ctx, s.db.sql().approvalStatus, namedArgs{"key": key}, func(sc scanner) error {
		found = true
		return sc.Scan(&status, &expired)
	})
	switch {
	case err != nil:
		return "", s.translate("approval status", err)
	case !found:
		return "", fmt.Errorf("%w: %s", ErrNotFound, key)
	case expired:
		return ApprovalExpired, nil
	}
	return ApprovalStatus(status), nil
}

// ApprovedNotRun returns the row of key when a person approved the call
// and it has not been claimed to run since (released by the decision, or
// by a try its downstream refused), which Get does not return; else
// ErrNotFound.
func (s *Store) ApprovedNotRun(ctx context.Context, key string) (Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	row, err := s.getAny(ctx, key)
	if err != nil {
		return Row{}, err
	}
	if row.State != stateReleased || row.ApprovalStatus != ApprovalApproved {
		return Row{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return row, nil
}

// GetOrApproved returns the row of key as Get does or, for a call a person
// approved that has not been claimed to run since, its released row (State
// Released, as ApprovedNotRun returns it), in one read: a Get and then an
// ApprovedNotRun both miss the row when its call is claimed between them.
// Else ErrNotFound.
func (s *Store) GetOrApproved(ctx context.Context, key string) (Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	row, err := s.getAny(ctx, key)
	if err == nil && row.State == stateReleased && row.ApprovalStatus != ApprovalApproved {
		return Row{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return row, err
}

// ApprovalPublished records that the request of a call awaiting approval
// is in the approvals stream.
func (s *Store) ApprovalPublished(ctx context.Context, row Row) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if row.Approval == nil {
		return fmt.Errorf("ledger: approval published %q: the row holds no approval", row.Key)
	}
	info := *row.Approval
	info.Published = true
	body, err := marshalApproval(info)
	if err != nil {
		return fmt.Errorf("ledger: approval published %q: %w", row.Key, err)
	}
	_, err = s.db.exec(ctx, s.db.sql().approvalPublished, namedArgs{"key": row.Key, "approval": string(body)})
	return s.translate("approval published", err)
}

// marshalApproval encodes info with its args byte for byte: json.Marshal
// would escape <, > and & in them, and they would no longer be the
// canonical args whose digest the approver checks.
func marshalApproval(info ApprovalInfo) ([]byte, error) { return info.MarshalJSON() }

// notAwaiting explains why key is not awaiting approval.
func (s *Store) notAwaiting(ctx context.Context, key string) error {
	row, err := s.getAny(ctx, key)
	if err != nil {
		return err
	}
	return notAwaitingError(key, row)
}

func notAwaitingError(key string, row Row) error {
	if row.State == AwaitingApproval { // expired, not yet swept
		return fmt.Errorf("%w: %s expired at %s", ErrNotAwaiting, key, row.ApprovalExpiresAt.Format(time.RFC3339))
	}
	if ev := row.LastDecision(); ev != nil {
		return fmt.Errorf("%w: %s was %s by %s at %s (%s)", ErrNotAwaiting, key, ev.Decision, ev.By, ev.At.Format(time.RFC3339), ev.Reason)
	}
	if row.State == stateReleased {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return fmt.Errorf("%w: %s is %s and never needed approval", ErrNotAwaiting, key, row.State)
}

// one runs a statement that returns at most one row.
func (s *Store) one(ctx context.Context, query string, args namedArgs) (row Row, found bool, err error) {
	err = s.db.queryRows(ctx, query, args, func(sc scanner) error {
		found = true
		return scanRow(sc, &row)
	})
	return row, found, err
}

// rows runs a statement that returns rows.
func (s *Store) rows(ctx context.Context, query string, args namedArgs) ([]Row, error) {
	out := []Row{}
	err := s.db.queryRows(ctx, query, args, func(sc scanner) error {
		var r Row
		if err := scanRow(sc, &r); err != nil {
			return err
		}
		out = append(out, r)
		return nil
	})
	return out, err
}
