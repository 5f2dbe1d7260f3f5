package ledger

// The ledger: what readers and operators do: read, list, resolve, purge.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// Resolution is an operator's verdict on an indeterminate row, and who took
// it and why, for the row's history.
type Resolution struct {
	Output json.RawMessage // the call happened: complete the row with this output
	NotRun bool            // the call did not happen: release the row so it can run
	By     string          // who decided (required)
	Reason string          // why (required)
	// Attempt is the row's attempt as the operator read it (Row.Attempt,
	// which `ledger show` prints), whose outcome the row's error says what
	// to check: a holder lost during attempt N leaves the row indeterminate
	// at N+1, the takeover that sent nothing, and N+1 is the one named.
	// 0 takes the row's, and is refused for a row resolved before
	// (released, it ran again).
	Attempt int64
}

// Decision is DecisionNotRun or DecisionCompleted.
func (r Resolution) Decision() string {
	if r.NotRun {
		return DecisionNotRun
	}
	return DecisionCompleted
}

// Filter selects rows for List; the zero value of a field selects all.
type Filter struct {
	State          State // empty: every state
	Stale          bool  // only in-flight rows whose lease has expired
	Tool           string
	ConversationID string
	Tenant         string        // only this tenant's rows (empty: every tenant's, the default's too)
	OlderThan      time.Duration // last updated more than this ago
	NewerThan      time.Duration // last updated at most this ago
	// Approval selects by ApprovalStatus: "any" for every call that needed
	// approval, "decided" for those approved, denied or expired, or one
	// status. The row of an approved call that has not run yet is released
	// (State Released) until a worker claims it to run it; it is listed
	// when Approval selects approved calls ("any", "decided", "approved"),
	// and no other released row is ever listed.
	Approval string
	// Groups selects the calls awaiting, or having needed, the approval of
	// one of these approver groups (ApprovalInfo.Group).
	Groups []string
	Order  Order // zero: LatestUpdateFirst
	Limit  int   // 0: 100
}

// Order is the order in which List returns rows.
type Order int

const (
	// LatestUpdateFirst lists the most recently updated row first.
	LatestUpdateFirst Order = iota
	// OldestExpiryFirst lists first the call awaiting approval that
	// expires first: the one that needs a decision the soonest.
	OldestExpiryFirst
	// LatestDecisionFirst lists first the call whose approval was decided
	// (approved, denied or expired) last, by the time in the decision's
	// event; rows without a decision come last.
	LatestDecisionFirst
)

// Released is the state of a row whose claim was given up; List returns
// one only for an approved call that has not run yet (Filter.Approval).
// It is not a State a Filter selects.
const Released = stateReleased

// listArgs are the arguments of the list statements for f, or why f is
// refused.
func (f Filter) listArgs() (namedArgs, error) {
	switch {
	case f.State != "" && !f.State.Valid():
		return nil, fmt.Errorf("ledger: list: unknown state %q (want in_flight, completed, failed, indeterminate or awaiting_approval)", f.State)
	case f.OlderThan < 0 || f.NewerThan < 0:
		return nil, errors.New("ledger: list: ages must not be negative")
	case f.Order < LatestUpdateFirst || f.Order > LatestDecisionFirst:
		return nil, fmt.Errorf("ledger: list: unknown order %d", f.Order)
	case f.Stale && f.Order != LatestUpdateFirst:
		return nil, errors.New("ledger: list: stale rows are listed by the end of their lease alone")
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	groups, err := json.Marshal(append([]string{}, f.Groups...))
	if err != nil {
		return nil, fmt.Errorf("ledger: list: %w", err)
	}
	return namedArgs{"state": string(f.State), "limit": f.Limit, "tool": f.Tool, "conversation": f.ConversationID, "tenant": f.Tenant,
		"older_ms": f.OlderThan.Milliseconds(), "newer_ms": f.NewerThan.Milliseconds(), "approval": f.Approval,
		"groups": string(groups)}, nil
}

// Get returns the row of key, or ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) (Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var row Row
	found := false
	err := s.db.queryRows(ctx, s.db.sql().get, namedArgs{"key": key}, func(sc scanner) error {
		found = true
		return scanRow(sc, &row)
	})
	if err != nil {
		return Row{}, s.translate("get", err)
	}
	if !found {
		return Row{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return row, nil
}

// List returns the rows f selects, in f's Order, at most f.Limit of them
// (Total counts them all).
func (s *Store) List(ctx context.Context, f Filter) ([]Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	args, err := f.listArgs()
	if err != nil {
		return nil, err
	}
	q := s.db.sql()
	query := q.list
	switch {
	case f.Stale:
		query = q.listStale
	case f.Order == OldestExpiryFirst:
		query = q.listByExpiry
	case f.Order == LatestDecisionFirst:
		query = q.listByDecision
	}
	rows := []Row{}
	err = s.db.queryRows(ctx, query, args, func(sc scanner) error {
		var r Row
		if err := scanRow(sc, &r); err != nil {
			return err
		}
		rows = append(rows, r)
		return nil
	})
	if err != nil {
		return nil, s.translate("list", err)
	}
	return rows, nil
}

// Total returns how many rows f selects, its Limit aside: with List, how
// many a list left out. Errors: those of List.
func (s *Store) Total(ctx context.Context, f Filter) (int64, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	args, err := f.listArgs()
	if err != nil {
		return 0, err
	}
	query := s.db.sql().listTotal
	if f.Stale {
		query = s.db.sql().listStaleTotal
	}
	var n int64
	err = s.db.queryRows(ctx, query, args, func(sc scanner) error { return sc.Scan(&n) })
	if err != nil {
		return 0, s.translate("list total", err)
	}
	return n, nil
}

// Counts returns the number of rows in each state, and of in-flight rows
// whose lease has expired under the key "stale".
func (s *Store) Counts(ctx context.Context) (map[string]int64, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	counts := map[string]int64{string(InFlight): 0, string(Completed): 0, string(Failed): 0, string(Indeterminate): 0,
		string(AwaitingApproval): 0, "stale": 0}
	err := s.db.queryRows(ctx, s.db.sql().counts, nil, func(sc scanner) error {
		var state string
		var n int64
		if err := sc.Scan(&state, &n); err != nil {
			return err
		}
		counts[state] = n
		return nil
	})
	if err != nil {
		return nil, s.translate("counts", err)
	}
	return counts, nil
}

// OldestInFlight returns the in-flight row whose lease ends (or ended)
// first: the call held the longest without news, or ErrNotFound when no
// call is in flight.
func (s *Store) OldestInFlight(ctx context.Context) (Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var row Row
	found := false
	err := s.db.queryRows(ctx, s.db.sql().oldestInFlight, nil, func(sc scanner) error {
		found = true
		return scanRow(sc, &row)
	})
	if err != nil {
		return Row{}, s.translate("oldest in flight", err)
	}
	if !found {
		return Row{}, fmt.Errorf("%w: no row in flight", ErrNotFound)
	}
	return row, nil
}

// Resolve settles an indeterminate row as an operator decided: completed with
// the given output (the call did happen), or released (NotRun: it did not,
// and a redelivery or replay may run it), and appends the decision to the
// row's history in the same statement. It is idempotent: a row already
// resolved with the same decision (and output) is left as it is, and changed
// is false. A row released as not run runs again, and can be indeterminate
// again at a later attempt: a decision settles only the attempt it names
// (r.Attempt), never one whose outcome nobody checked.
// Errors: ErrNotFound; ErrOtherAttempt when the row is indeterminate at
// another attempt than r.Attempt, or r.Attempt is 0 and the row was resolved
// before, or it was resolved at another attempt than r.Attempt; ErrResolved when the row was resolved with another decision;
// ErrNotIndeterminate when it is in another state without having been
// resolved; ErrInvalidOutput.
func (s *Store) Resolve(ctx context.Context, key string, r Resolution) (changed bool, err error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	switch {
	case r.NotRun == (r.Output != nil):
		return false, errors.New("ledger: resolve: give exactly one of an output and not-run")
	case strings.TrimSpace(r.Reason) == "" || strings.TrimSpace(r.By) == "":
		return false, errors.New("ledger: resolve: who decided and why are required")
	}
	if !r.NotRun {
		if err := checkOutput("resolve", key, r.Output); err != nil {
			return false, err
		}
	}
	row, err := s.getAny(ctx, key)
	if err != nil {
		return false, err
	}
	if row.State == Indeterminate {
		attempt := r.Attempt
		if last := row.LastResolution(); attempt == 0 && last != nil {
			return false, fmt.Errorf("%w: %s was resolved %s by %s at %s (%q), ran again and is indeterminate at attempt %d: check that attempt's outcome and name it",
				ErrOtherAttempt, key, last.Decision, last.By, last.At.Format(time.RFC3339), last.Reason, row.Attempt)
		}
		if attempt == 0 {
			attempt = row.Attempt
		}
		if attempt != row.Attempt {
			return false, fmt.Errorf("%w: %s is indeterminate at attempt %d, not %d: check the outcome its error names and give attempt %d",
				ErrOtherAttempt, key, row.Attempt, attempt, row.Attempt)
		}
		ev := Event{At: time.Now().UTC().Truncate(time.Millisecond), By: r.By, Action: "resolve", Decision: r.Decision(),
			Reason: r.Reason, From: row.State, Error: row.Error, Output: r.Output, Attempt: attempt}
		evJSON, err := json.Marshal(ev)
		if err != nil {
			return false, fmt.Errorf("ledger: resolve %s: %w", key, err)
		}
		q := s.db.sql()
		var n int64
		if r.NotRun {
			n, err = s.db.exec(ctx, q.resolveNotRun, namedArgs{"key": key, "event": string(evJSON), "attempt": attempt})
		} else {
			n, err = s.db.exec(ctx, q.resolveCompleted, namedArgs{"key": key, "event": string(evJSON), "result": string(r.Output), "attempt": attempt})
		}
		if err != nil {
			return false, s.translate("resolve", err)
		}
		if n == 1 {
			return true, nil
		}
		// Another operator resolved it between the read and the update
		// (or it was resolved, ran again and is at another attempt).
		if row, err = s.getAny(ctx, key); err != nil {
			return false, err
		}
	}
	last := row.LastResolution()
	if last == nil {
		if row.State == stateReleased {
			return false, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return false, fmt.Errorf("%w: %s is %s", ErrNotIndeterminate, key, row.State)
	}
	state := string(row.State)
	if row.State == stateReleased {
		state = "released (no row until the call is claimed again)"
	}
	// A repeat is of the attempt resolved; another attempt (the call ran
	// again) was never resolved. A history from before attempts were
	// recorded has none to compare.
	if r.Attempt != 0 && last.Attempt != 0 && r.Attempt != last.Attempt {
		return false, fmt.Errorf("%w: %s was resolved %s at attempt %d by %s at %s (%q), not at attempt %d; it is now %s at attempt %d",
			ErrOtherAttempt, key, last.Decision, last.Attempt, last.By, last.At.Format(time.RFC3339), last.Reason, r.Attempt, state, row.Attempt)
	}
	if last.Decision == r.Decision() && (r.NotRun || sameJSON(last.Output, r.Output)) {
		return false, nil
	}
	return false, fmt.Errorf("%w: %s was resolved %s by %s at %s (%q); it is now %s", ErrResolved, key, last.Decision,
		last.By, last.At.Format(time.RFC3339), last.Reason, state)
}

// getAny returns the row of key, released or not, or ErrNotFound.
func (s *Store) getAny(ctx context.Context, key string) (Row, error) {
	var row Row
	found := false
	err := s.db.queryRows(ctx, s.db.sql().getAny, namedArgs{"key": key}, func(sc scanner) error {
		found = true
		return scanRow(sc, &row)
	})
	if err != nil {
		return Row{}, s.translate("get", err)
	}
	if !found {
		return Row{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return row, nil
}

// sameJSON reports whether a and b are the same JSON value (Postgres keeps
// a history as jsonb, which may reorder an object's members).
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// Purge deletes completed, failed and released rows neither updated nor
// answering a duplicate for more than olderThan and answeredEvery (see
// Row.AnsweredAt: a row keeps the call's memory for the retention after
// its last answer, since the duplicate's job can come back as long after it
// as the first job after the first answer, and its record of its answers
// may lag by answeredEvery), in batches of batchSize rows (0: 1000) so that no statement
// holds locks for long. In-flight and indeterminate rows are never purged.
// Before it deletes anything it records the purge (see LastPurge), so that a
// dead letter older than what it may have deleted is not requeued. The
// retention must exceed every way a job can come back (the jobs stream's and
// the DLQ's max age), or a replay or a requeue would run a call again; it also
// bounds how long a holder may stall and still be fenced out, since a purged
// key's next claim starts again at attempt 1.
func (s *Store) Purge(ctx context.Context, olderThan time.Duration, batchSize int, opts ...PurgeOption) (int64, error) {
	var o purgeOptions
	for _, opt := range opts {
		opt(&o)
	}
	cutoff, err := s.purgeCutoff(ctx, olderThan)
	if err != nil {
		return 0, err
	}
	if batchSize <= 0 {
		batchSize = 1000
	}
	rctx, cancel := withDefaultTimeout(ctx)
	_, err = s.db.exec(rctx, s.db.sql().recordPurge,
		namedArgs{"cutoff_ms": cutoff, "older_than_ms": olderThan.Milliseconds(), "purged_at_ms": cutoff + olderThan.Milliseconds()})
	cancel()
	if err != nil {
		return 0, s.translate("purge", err)
	}
	var total int64
	for {
		bctx, cancel := withDefaultTimeout(ctx)
		n, err := s.db.exec(bctx, s.db.sql().purge, namedArgs{"cutoff_ms": cutoff, "batch": batchSize, "only": o.only, "except": o.exceptJSON(), "every_ms": s.answeredEveryMS()})
		cancel()
		if err != nil {
			return total, s.translate("purge", err)
		}
		total += n
		if o.progress != nil {
			o.progress(total)
		}
		// A batch whose rows changed meanwhile deletes fewer than it
		// found (each row is checked again as it is): only an empty one
		// means nothing is left.
		if n == 0 {
			return total, nil
		}
	}
}

// PurgeOption is a knob of one Purge call.
type PurgeOption func(*purgeOptions)

type purgeOptions struct {
	progress func(deleted int64)
	only     string
	except   []string
}

func (o *purgeOptions) exceptJSON() string {
	b, _ := json.Marshal(append([]string{}, o.except...))
	return string(b)
}

// PurgeOnly makes Purge (and PurgeCount) delete only the rows of tool.
func PurgeOnly(tool string) PurgeOption {
	return func(o *purgeOptions) { o.only = tool }
}

// PurgeExcept makes Purge (and PurgeCount) keep the rows of these tools,
// which a purge of their own, with their own retention, deletes.
func PurgeExcept(tools ...string) PurgeOption {
	return func(o *purgeOptions) { o.except = append(o.except, tools...) }
}

// PurgeProgress makes Purge call f after each batch with the rows it has
// deleted so far.
func PurgeProgress(f func(deleted int64)) PurgeOption {
	return func(o *purgeOptions) { o.progress = f }
}

// PurgeCount returns how many rows Purge would delete now with olderThan
// (and the same PurgeOnly and PurgeExcept), and deletes nothing.
func (s *Store) PurgeCount(ctx context.Context, olderThan time.Duration, opts ...PurgeOption) (int64, error) {
	var o purgeOptions
	for _, opt := range opts {
		opt(&o)
	}
	cutoff, err := s.purgeCutoff(ctx, olderThan)
	if err != nil {
		return 0, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var n int64
	err = s.db.queryRows(ctx, s.db.sql().purgeCount, namedArgs{"cutoff_ms": cutoff, "only": o.only, "except": o.exceptJSON(), "every_ms": s.answeredEveryMS()}, func(sc scanner) error { return sc.Scan(&n) })
	return n, s.translate("purge count", err)
}

// purgeCutoff is the database's now less olderThan, in Unix milliseconds:
// one instant for the record and every batch of a purge.
func (s *Store) purgeCutoff(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan <= 0 {
		return 0, errors.New("ledger: purge: the age must be positive")
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var now int64
	err := s.db.queryRows(ctx, s.db.sql().clock, nil, func(sc scanner) error { return sc.Scan(&now) })
	if err != nil {
		return 0, s.translate("purge", err)
	}
	return now - olderThan.Milliseconds(), nil
}

// PurgeRecord is what the ledger remembers of its purges.
type PurgeRecord struct {
	// PurgedBefore: rows finished before it may have been deleted. It is
	// the latest cutoff of any purge; zero when the ledger was never purged.
	PurgedBefore time.Time     `json:"purged_before"`
	OlderThan    time.Duration `json:"older_than"` // the last purge's retention
	At           time.Time     `json:"at"`         // when the last purge began
}

// LastPurge returns what the ledger remembers of its purges, the zero
// PurgeRecord when it was never purged. A ledger whose schema predates the
// record is an error: migrate it (the worker does at start).
func (s *Store) LastPurge(ctx context.Context) (PurgeRecord, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var r PurgeRecord
	err := s.db.queryRows(ctx, s.db.sql().lastPurge, nil, func(sc scanner) error {
		var before, olderThan, at int64
		if err := sc.Scan(&before, &olderThan, &at); err != nil {
			return err
		}
		r = PurgeRecord{PurgedBefore: time.UnixMilli(before).UTC(), OlderThan: time.Duration(olderThan) * time.Millisecond,
			At: time.UnixMilli(at).UTC()}
		return nil
	})
	if err != nil {
		return PurgeRecord{}, s.translate("last purge", err)
	}
	return r, nil
}
