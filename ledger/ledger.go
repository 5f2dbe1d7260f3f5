// Package ledger is toolq's claim store: before a write tool runs, the
// consumer claims the call's key here, and every later write about that call
// is fenced by the claim (its attempt and token), so a call takes effect once
// however often it is delivered.
//
// Store has two backends with identical semantics, checked by one conformance
// suite: Postgres (pgx, shared by any number of consumers) and SQLite (the
// embedded default, one host). Lease times come from the database's clock, so
// clock skew between consumer hosts cannot break a lease. Errors of the
// drivers never leave this package: a database that cannot be reached, or
// cannot take writes for now (a Postgres primary demoted by a failover, a
// deadlock that outlasted the retries), gives an error that wraps
// ErrUnavailable, the others wrap the sentinels below or carry only a
// message.
package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// State is the state of a ledger row.
type State string

// The states of a row (docs/design.md, "The ledger row").
const (
	InFlight      State = "in_flight"     // claimed; the holder's lease says until when
	Completed     State = "completed"     // the tool succeeded; Result is its output
	Failed        State = "failed"        // the tool failed definitely; Error says why
	Indeterminate State = "indeterminate" // the outcome is unknown; an operator resolves it
)

// Valid reports whether s is one of the four states.
func (s State) Valid() bool {
	switch s {
	case InFlight, Completed, Failed, Indeterminate:
		return true
	}
	return false
}

// Errors of the ledger. They are returned wrapped with the operation's name;
// test them with errors.Is.
var (
	ErrNotFound         = errors.New("ledger: key not found")
	ErrFenced           = errors.New("ledger: fenced out (the claim was taken over, settled or released)")
	ErrLeaseHeld        = errors.New("ledger: lease still held by another attempt")
	ErrMaterialMismatch = errors.New("ledger: key exists with different material (collision or tampering)")
	ErrNotIndeterminate = errors.New("ledger: row is not indeterminate")
	ErrUnavailable      = errors.New("ledger: database unavailable")
	ErrInvalidOutput    = errors.New("ledger: output is not valid JSON in UTF-8")
	ErrResolved         = errors.New("ledger: row was resolved otherwise")
)

// DefaultTimeout bounds every call whose context has no deadline.
const DefaultTimeout = 15 * time.Second

// Claim asks for the right to run one call.
type Claim struct {
	Key            string
	ConversationID string
	TurnIndex      int64
	Tool           string
	Ordinal        int64
	ArgsDigest     string // SHA-256 of the canonical args, hex
	ToolUseID      string // recorded as first_tool_use_id when the claim is new
	Owner          string // the consumer instance, for operators
	Lease          time.Duration
	TraceID        string // the claiming span, so duplicates can link to it
	SpanID         string
	// Token is unique to this claim: the row keeps it (ClaimToken), so
	// that a claim whose answer was lost can recognise its own row, and
	// every fenced write names it (Fence).
	Token string
	// AsyncCommit lets Postgres answer the claim before it reaches the
	// disk (synchronous_commit off for its transaction alone), when every
	// claim of the batch asks for it. A crash of Postgres in the moment
	// after (up to wal_writer_delay, 200 ms by default) can lose the claim:
	// the key is then free again and its next claim takes the same attempt
	// under another token, while the first holder's writes are fenced out.
	// The holder's first durable write (Complete and the rest wait for the
	// disk) makes the claim durable with it: the WAL is written in order.
	// Ask for it only for a call that may run again under the same key
	// without a second effect (a keyed_write); it needs a Token. SQLite
	// ignores it: its claims always wait.
	AsyncCommit bool
}

// SameCall reports whether the row was claimed for the same call as c (the
// claim's check, for a reader that looked the row up without claiming).
func (c *Claim) SameCall(r *Row) bool { return c.sameMaterial(r) }

// sameMaterial reports whether the row was claimed for the same call.
func (c *Claim) sameMaterial(r *Row) bool {
	return c.ConversationID == r.ConversationID && c.TurnIndex == r.TurnIndex && c.Tool == r.Tool &&
		c.Ordinal == r.Ordinal && c.ArgsDigest == r.ArgsDigest
}

// Fence identifies one claim of a key: a write whose attempt or token is not
// the row's fails with ErrFenced. The token is what makes it one claim: a
// claim lost in a crash of the database (Claim.AsyncCommit) is made again
// at the same attempt, and the token tells the two holders apart.
type Fence struct {
	Key     string
	Attempt int64
	Token   string
}

// Row is one ledger row.
type Row struct {
	Key            string          `json:"key"`
	ConversationID string          `json:"conversation_id"`
	TurnIndex      int64           `json:"turn_index"`
	Tool           string          `json:"tool"`
	Ordinal        int64           `json:"ordinal"`
	ArgsDigest     string          `json:"args_digest"`
	State          State           `json:"state"`
	Attempt        int64           `json:"attempt"`
	Owner          string          `json:"owner"`
	LeaseUntil     time.Time       `json:"lease_until"`
	FirstToolUseID string          `json:"first_tool_use_id"`
	TraceID        string          `json:"trace_id,omitempty"`
	SpanID         string          `json:"span_id,omitempty"`
	Result         json.RawMessage `json:"result,omitempty"`
	Error          *ErrorInfo      `json:"error,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	// LeaseRemaining is how long the lease still runs by the database's
	// clock when the row was read; zero once it has expired.
	LeaseRemaining time.Duration `json:"lease_remaining_ms"`
	// Failures counts the call's tries that ended unsettled for a reason of
	// their own (see Store.CountFailures); ClaimToken is the Token of the
	// claim or takeover that took the row.
	Failures   int64  `json:"failures"`
	ClaimToken string `json:"-"`
	// History is the operators' decisions on the row, oldest first.
	History []Event `json:"history,omitempty"`
	// AnsweredAt is when a claim last found the row settled and answered
	// a duplicate from it, to within answeredEvery (zero: never). A purge
	// counts the retention from the later of it and UpdatedAt.
	AnsweredAt time.Time `json:"answered_at,omitzero"`
}

// answeredEvery is how stale Row.AnsweredAt may be. A claim that answers a
// duplicate from a settled row writes the time only when the stored one is
// older, so that duplicates of a key cost a write an hour at most (a
// duplicate's claim otherwise writes nothing: on Postgres it takes no
// transaction id and no WAL flush), and a purge keeps such a row up to this
// much longer than its retention, which is days.
const answeredEvery = time.Hour

// Event is one operator decision recorded in a row's history.
type Event struct {
	At       time.Time       `json:"at"`
	By       string          `json:"by"`
	Action   string          `json:"action"`   // "resolve"
	Decision string          `json:"decision"` // "completed" or "not_run"
	Reason   string          `json:"reason"`
	From     State           `json:"from"`            // the row's state before
	Error    *ErrorInfo      `json:"error,omitempty"` // the error it recorded then
	Output   json.RawMessage `json:"output,omitempty"`
}

// The decisions of a resolution, as recorded in Event.Decision.
const (
	DecisionCompleted = "completed"
	DecisionNotRun    = "not_run"
)

// LastResolution returns the latest resolve event of the row's history, or
// nil when it was never resolved.
func (r *Row) LastResolution() *Event {
	for i := len(r.History) - 1; i >= 0; i-- {
		if r.History[i].Action == "resolve" {
			return &r.History[i]
		}
	}
	return nil
}

// Fence returns the fence of the row's current attempt.
func (r *Row) Fence() Fence { return Fence{Key: r.Key, Attempt: r.Attempt, Token: r.ClaimToken} }

// LeaseExpired reports whether the row is in flight with its lease run out.
func (r *Row) LeaseExpired() bool { return r.State == InFlight && r.LeaseRemaining <= 0 }

// ErrorInfo is the error recorded with a failed, ambiguous or indeterminate
// attempt.
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ClaimResult is the answer to one Claim. Exactly one of these holds:
// Claimed is true and Row is the new row (in flight, ours: attempt 1, or
// for a key released before the attempt after the released one); Err is
// set (ErrMaterialMismatch: the key belongs to another call, and its row is
// withheld); or Row is the existing row of the same call.
type ClaimResult struct {
	Claimed bool
	Row     Row
	Err     error
}

// Resolution is an operator's verdict on an indeterminate row, and who took
// it and why, for the row's history.
type Resolution struct {
	Output json.RawMessage // the call happened: complete the row with this output
	NotRun bool            // the call did not happen: release the row so it can run
	By     string          // who decided (required)
	Reason string          // why (required)
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
	OlderThan      time.Duration // last updated more than this ago
	NewerThan      time.Duration // last updated at most this ago
	Limit          int           // 0: 100
}

// Store is the ledger on one database. Its methods are safe for concurrent
// use. Open it with Open, OpenPostgres or OpenSQLite.
type Store struct {
	db      database
	backend string
}

// database is what a backend provides: the statements that differ between
// Postgres and SQLite, and a way to run the ones that do not.
type database interface {
	claim(ctx context.Context, claims []Claim) ([]claimed, error)
	completeBatch(ctx context.Context, cs []Completion) (map[Fence]bool, error)
	exec(ctx context.Context, query string, args ...any) (int64, error)
	queryRows(ctx context.Context, query string, args []any, each func(scanner) error) error
	migrate(ctx context.Context) error
	sql() *dialect
	describe(err error) (message string, unavailable bool)
	// conflicted reports a statement the database aborted to break a
	// deadlock or a serialization conflict: nothing of it was applied, and
	// run again it will most likely succeed.
	conflicted(err error) bool
	ping(ctx context.Context) error
	close()
}

type scanner interface{ Scan(dest ...any) error }

// claimed is the row a claim statement returned and whether it inserted it.
type claimed struct {
	inserted bool
	row      Row
}

// Open opens the ledger named by databaseURL (postgres:// or postgresql://),
// or with an empty URL the SQLite file ledger.db under dataDir. It does not
// migrate: call Migrate.
func Open(ctx context.Context, databaseURL, dataDir string) (*Store, error) {
	switch {
	case databaseURL == "":
		return OpenSQLite(ctx, sqlitePath(dataDir))
	case strings.HasPrefix(databaseURL, "postgres://"), strings.HasPrefix(databaseURL, "postgresql://"):
		return OpenPostgres(ctx, databaseURL)
	case strings.HasPrefix(databaseURL, "sqlite://"), strings.HasPrefix(databaseURL, "file:"):
		return OpenSQLite(ctx, strings.TrimPrefix(strings.TrimPrefix(databaseURL, "sqlite://"), "file:"))
	default:
		return nil, fmt.Errorf("ledger: unsupported database URL %q (want postgres://… or empty for SQLite)", redact(databaseURL))
	}
}

// Backend is "postgres" or "sqlite".
func (s *Store) Backend() string { return s.backend }

// Close closes the store's connections.
func (s *Store) Close() { s.db.close() }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return s.translate("ping", s.db.ping(ctx))
}

// Migrate applies the embedded schema migrations that the database lacks. It
// is safe when several processes start at once.
func (s *Store) Migrate(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return s.translate("migrate", s.db.migrate(ctx))
}

// Claim claims a batch of keys in one round trip. Each claim either inserts a
// new in-flight row (attempt 1), claims a released key again at the attempt
// after its last one (so that no fence of a key is ever issued twice), or
// finds the existing row, which comes back
// for the caller to act on; a row with different material comes back as
// ErrMaterialMismatch instead. A key that appears twice in the batch is
// claimed by its first occurrence; the later ones see that row. The error is
// for the batch as a whole (ErrUnavailable and the like); results are in the
// order of claims.
func (s *Store) Claim(ctx context.Context, claims []Claim) ([]ClaimResult, error) {
	if len(claims) == 0 {
		return nil, nil
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	unique := make([]Claim, 0, len(claims))
	seen := make(map[string]bool, len(claims))
	for _, c := range claims {
		if c.Key == "" || c.Lease <= 0 {
			return nil, fmt.Errorf("ledger: claim %q: key and a positive lease are required", c.Key)
		}
		if c.AsyncCommit && c.Token == "" {
			return nil, fmt.Errorf("ledger: claim %q: an asynchronous commit needs a token", c.Key)
		}
		if !seen[c.Key] {
			seen[c.Key] = true
			unique = append(unique, c)
		}
	}
	// Every batch takes its row locks in key order, so that concurrent
	// batches over the same keys queue up instead of deadlocking.
	sort.Slice(unique, func(i, j int) bool { return unique[i].Key < unique[j].Key })
	first := make(map[string]int, len(unique))
	for i, c := range unique {
		first[c.Key] = i
	}
	var got []claimed
	err := s.retryConflicts(ctx, func() (err error) {
		got, err = s.db.claim(ctx, unique)
		return err
	})
	if err != nil {
		return nil, s.translate("claim", err)
	}
	out := make([]ClaimResult, len(claims))
	handedOut := make(map[string]bool, len(unique))
	for i := range claims {
		c := &claims[i]
		r := got[first[c.Key]]
		switch {
		case !c.sameMaterial(&r.row):
			out[i] = ClaimResult{Err: fmt.Errorf("%w: %s", ErrMaterialMismatch, c.Key)}
		case r.inserted && !handedOut[c.Key]:
			out[i] = ClaimResult{Claimed: true, Row: r.row}
			handedOut[c.Key] = true
		default:
			out[i] = ClaimResult{Row: r.row}
		}
	}
	return out, nil
}

// Takeover takes over an in-flight row whose lease has expired, by a
// compare-and-set on its claim (f): the winner gets the row with the next
// attempt number, a fresh lease and token, its own, which must be unique to
// this takeover as a claim's is. Errors: ErrLeaseHeld while the lease runs,
// ErrFenced when another taker won or the row was settled, ErrNotFound when
// it was released.
func (s *Store) Takeover(ctx context.Context, f Fence, owner, token string, lease time.Duration) (Row, error) {
	if token == "" {
		return Row{}, fmt.Errorf("ledger: takeover %q: a token is required", f.Key)
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	q := s.db.sql()
	var row Row
	found := false
	err := s.db.queryRows(ctx, q.takeover, []any{f.Key, f.Attempt, owner, lease.Milliseconds(), f.Token, token}, func(sc scanner) error {
		found = true
		return scanRow(sc, &row)
	})
	if err != nil {
		return Row{}, s.translate("takeover", err)
	}
	if found {
		return row, nil
	}
	return Row{}, s.whyNot(ctx, "takeover", f, true)
}

// whyNot explains a fenced write that changed nothing.
func (s *Store) whyNot(ctx context.Context, op string, f Fence, takeover bool) error {
	row, err := s.Get(ctx, f.Key)
	switch {
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("%w: %s (%s)", ErrNotFound, f.Key, op)
	case err != nil:
		return err
	case row.Attempt == f.Attempt && row.ClaimToken == f.Token && row.State == InFlight && takeover && !row.LeaseExpired():
		return fmt.Errorf("%w: %s has %s left (%s)", ErrLeaseHeld, f.Key, row.LeaseRemaining.Round(time.Millisecond), op)
	case row.Attempt == f.Attempt && row.ClaimToken != f.Token:
		return fmt.Errorf("%w: %s %s with attempt %d, the row is %s at that attempt under another claim (the database lost the first in a crash)",
			ErrFenced, op, f.Key, f.Attempt, row.State)
	default:
		return fmt.Errorf("%w: %s %s with attempt %d, the row is %s at attempt %d", ErrFenced, op, f.Key, f.Attempt, row.State, row.Attempt)
	}
}

// Extend renews the lease of an in-flight claim to lease from now (by the
// database's clock). ErrFenced or ErrNotFound: the claim is no longer ours.
func (s *Store) Extend(ctx context.Context, f Fence, lease time.Duration) error {
	return s.fenced(ctx, "extend", f, s.db.sql().extend, lease.Milliseconds())
}

// Complete records the tool's output and settles the row as completed. An
// output that is not valid JSON in UTF-8 is refused with ErrInvalidOutput.
func (s *Store) Complete(ctx context.Context, f Fence, output json.RawMessage) error {
	if err := checkOutput("complete", f.Key, output); err != nil {
		return err
	}
	return s.fenced(ctx, "complete", f, s.db.sql().complete, string(output))
}

// checkOutput refuses an output that is not valid JSON in UTF-8. json.Valid
// alone accepts invalid bytes inside strings, which Postgres would refuse
// (SQLSTATE 22021) and SQLite would store.
func checkOutput(op, key string, output json.RawMessage) error {
	if !json.Valid(output) || !utf8.Valid(output) {
		return fmt.Errorf("%w: %s %s", ErrInvalidOutput, op, key)
	}
	return nil
}

// Completion is one fenced completion for CompleteBatch.
type Completion struct {
	Fence  Fence
	Output json.RawMessage
}

// CompleteBatch completes many claims in one round trip, as a consumer that
// group-commits the results of concurrent tools does. The error is for the
// batch as a whole (ErrUnavailable and the like); errs[i] is nil when cs[i]
// was applied, or says why not (ErrFenced, ErrNotFound, ErrInvalidOutput, or
// the database's refusal of that row), as Complete would.
func (s *Store) CompleteBatch(ctx context.Context, cs []Completion) (errs []error, err error) {
	if len(cs) == 0 {
		return nil, nil
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	errs = make([]error, len(cs))
	valid := make([]Completion, 0, len(cs))
	at := make([]int, 0, len(cs)) // valid[j] is cs[at[j]]
	for i, c := range cs {
		if errs[i] = checkOutput("complete", c.Fence.Key, c.Output); errs[i] == nil {
			valid, at = append(valid, c), append(at, i)
		}
	}
	if len(valid) == 0 {
		return errs, nil
	}
	validErrs, err := s.completeBatch(ctx, valid)
	if err != nil {
		return nil, err
	}
	for j, i := range at {
		errs[i] = validErrs[j]
	}
	return errs, nil
}

// completeBatch is CompleteBatch for outputs already checked.
func (s *Store) completeBatch(ctx context.Context, cs []Completion) ([]error, error) {
	errs := make([]error, len(cs))
	// In key order, as Claim, so that concurrent batches cannot deadlock.
	sorted := slices.Clone(cs)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Fence.Key < sorted[j].Fence.Key })
	var done map[Fence]bool
	err := s.retryConflicts(ctx, func() (err error) {
		done, err = s.db.completeBatch(ctx, sorted)
		return err
	})
	if err != nil {
		err = s.translate("complete", err)
		if errors.Is(err, ErrUnavailable) || errors.Is(err, context.Canceled) {
			return nil, err
		}
		// The batch is one transaction: a row the database refused rolled
		// back all the others. Apply them one at a time, so that each gets
		// its own answer and the innocent ones complete.
		for i, c := range cs {
			errs[i] = s.Complete(ctx, c.Fence, c.Output)
			if errors.Is(errs[i], ErrUnavailable) || errors.Is(errs[i], context.Canceled) {
				return nil, errs[i]
			}
		}
		return errs, nil
	}
	for i, c := range cs {
		if !done[c.Fence] {
			errs[i] = s.whyNot(ctx, "complete", c.Fence, false)
		}
	}
	return errs, nil
}

// Fail settles the row as failed: the downstream answered no, and that answer
// is the call's result from now on.
func (s *Store) Fail(ctx context.Context, f Fence, e ErrorInfo) error {
	return s.fenced(ctx, "fail", f, s.db.sql().fail, encodeError(e))
}

// EndLease ends the lease now and records why, leaving the row in flight: a
// keyed write whose outcome is ambiguous is retried by the next delivery,
// which takes over with the same key.
func (s *Store) EndLease(ctx context.Context, f Fence, e ErrorInfo) error {
	return s.fenced(ctx, "end lease", f, s.db.sql().endLease, encodeError(e))
}

// MarkIndeterminate settles the row as indeterminate: an unkeyed write whose
// outcome is unknown, left for an operator to resolve.
func (s *Store) MarkIndeterminate(ctx context.Context, f Fence, e ErrorInfo) error {
	return s.fenced(ctx, "mark indeterminate", f, s.db.sql().indeterminate, encodeError(e))
}

// CountFailures records on the claim's row that n tries of the call have
// failed so far. The worker calls it before it gives a failed try back
// (Release, EndLease), and compares n with its delivery limit; deliveries
// that only waited never reach it. Errors: ErrFenced or ErrNotFound when the
// claim is no longer this fence's.
func (s *Store) CountFailures(ctx context.Context, f Fence, n int64) error {
	return s.fenced(ctx, "count failures", f, s.db.sql().failures, n)
}

// Release gives the claim up: the tool was not sent, so nothing happened and
// the next delivery may claim the key afresh. The row stays, released, and
// counts as absent for every reader (Get gives ErrNotFound) but keeps its
// attempt: the next claim takes the attempt after it, so this fence, and any
// older one, can never match the new claim.
func (s *Store) Release(ctx context.Context, f Fence) error {
	return s.fenced(ctx, "release", f, s.db.sql().release)
}

func (s *Store) fenced(ctx context.Context, op string, f Fence, query string, args ...any) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	n, err := s.db.exec(ctx, query, append(append([]any{f.Key, f.Attempt}, args...), f.Token)...)
	if err != nil {
		return s.translate(op, err)
	}
	if n == 0 {
		return s.whyNot(ctx, op, f, false)
	}
	return nil
}

// Answered records that the settled row of key answered a call outside a
// claim (a claim records it itself), so that retention counts from this
// answer (see Row.AnsweredAt): at most one write an hour a row. A row not
// settled, or not there, is left alone.
func (s *Store) Answered(ctx context.Context, key string) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	_, err := s.db.exec(ctx, s.db.sql().answered, key)
	return s.translate("answered", err)
}

// Get returns the row of key, or ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) (Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var row Row
	found := false
	err := s.db.queryRows(ctx, s.db.sql().get, []any{key}, func(sc scanner) error {
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

// List returns rows, most recently updated first.
func (s *Store) List(ctx context.Context, f Filter) ([]Row, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if f.State != "" && !f.State.Valid() {
		return nil, fmt.Errorf("ledger: list: unknown state %q (want in_flight, completed, failed or indeterminate)", f.State)
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	if f.OlderThan < 0 || f.NewerThan < 0 {
		return nil, errors.New("ledger: list: ages must not be negative")
	}
	q := s.db.sql()
	query := q.list
	if f.Stale {
		query = q.listStale
	}
	args := []any{string(f.State), f.Limit, f.Tool, f.ConversationID, f.OlderThan.Milliseconds(), f.NewerThan.Milliseconds()}
	rows := []Row{}
	err := s.db.queryRows(ctx, query, args, func(sc scanner) error {
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

// Counts returns the number of rows in each state, and of in-flight rows
// whose lease has expired under the key "stale".
func (s *Store) Counts(ctx context.Context) (map[string]int64, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	counts := map[string]int64{string(InFlight): 0, string(Completed): 0, string(Failed): 0, string(Indeterminate): 0, "stale": 0}
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
// is false. Errors: ErrNotFound; ErrResolved when the row was resolved with
// another decision; ErrNotIndeterminate when it is in another state without
// having been resolved; ErrInvalidOutput.
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
		ev := Event{At: time.Now().UTC().Truncate(time.Millisecond), By: r.By, Action: "resolve", Decision: r.Decision(),
			Reason: r.Reason, From: row.State, Error: row.Error, Output: r.Output}
		evJSON, err := json.Marshal(ev)
		if err != nil {
			return false, fmt.Errorf("ledger: resolve %s: %w", key, err)
		}
		q := s.db.sql()
		var n int64
		if r.NotRun {
			n, err = s.db.exec(ctx, q.resolveNotRun, key, string(evJSON))
		} else {
			n, err = s.db.exec(ctx, q.resolveCompleted, key, string(evJSON), string(r.Output))
		}
		if err != nil {
			return false, s.translate("resolve", err)
		}
		if n == 1 {
			return true, nil
		}
		// Another operator resolved it between the read and the update.
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
	if last.Decision == r.Decision() && (r.NotRun || sameJSON(last.Output, r.Output)) {
		return false, nil
	}
	state := string(row.State)
	if row.State == stateReleased {
		state = "released (no row until the call is claimed again)"
	}
	return false, fmt.Errorf("%w: %s was resolved %s by %s at %s (%q); it is now %s", ErrResolved, key, last.Decision,
		last.By, last.At.Format(time.RFC3339), last.Reason, state)
}

// stateReleased is the state of a row whose claim was given up; to every
// reader but Resolve the key has no row.
const stateReleased State = "released"

// getAny returns the row of key, released or not, or ErrNotFound.
func (s *Store) getAny(ctx context.Context, key string) (Row, error) {
	var row Row
	found := false
	err := s.db.queryRows(ctx, s.db.sql().getAny, []any{key}, func(sc scanner) error {
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

// Purge deletes completed, failed and released rows last updated more than
// olderThan ago that answered no duplicate in that time either (see
// Row.AnsweredAt: a row keeps the call's memory for the retention after
// its last answer, since the duplicate's job can come back as long after it
// as the first job after the first answer), in batches of batchSize rows (0: 1000) so that no statement
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
	_, err = s.db.exec(rctx, s.db.sql().recordPurge, cutoff, olderThan.Milliseconds(), cutoff+olderThan.Milliseconds())
	cancel()
	if err != nil {
		return 0, s.translate("purge", err)
	}
	var total int64
	for {
		bctx, cancel := withDefaultTimeout(ctx)
		n, err := s.db.exec(bctx, s.db.sql().purge, cutoff, batchSize, o.only, o.exceptJSON())
		cancel()
		if err != nil {
			return total, s.translate("purge", err)
		}
		total += n
		if o.progress != nil {
			o.progress(total)
		}
		if n < int64(batchSize) {
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
	err = s.db.queryRows(ctx, s.db.sql().purgeCount, []any{cutoff, o.only, o.exceptJSON()}, func(sc scanner) error { return sc.Scan(&n) })
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

func encodeError(e ErrorInfo) string {
	b, _ := json.Marshal(e)
	return string(b)
}

// scanRow reads the columns of dialect.cols, after the leading ones if any.
func scanRow(sc scanner, r *Row, leading ...any) error {
	var state, result, errText, history string
	var leaseMS, remainingMS, createdMS, updatedMS, answeredMS int64
	dest := append(leading, &r.Key, &r.ConversationID, &r.TurnIndex, &r.Tool, &r.Ordinal, &r.ArgsDigest, &state,
		&r.Attempt, &r.Owner, &leaseMS, &remainingMS, &r.FirstToolUseID, &r.TraceID, &r.SpanID, &result,
		&errText, &createdMS, &updatedMS, &history, &r.Failures, &r.ClaimToken, &answeredMS)
	if err := sc.Scan(dest...); err != nil {
		return err
	}
	r.History = nil
	if history != "" && history != "[]" {
		if err := json.Unmarshal([]byte(history), &r.History); err != nil {
			r.History = []Event{{Action: "unreadable", Reason: history}}
		}
	}
	r.State = State(state)
	r.LeaseUntil = time.UnixMilli(leaseMS).UTC()
	r.LeaseRemaining = time.Duration(max(remainingMS, 0)) * time.Millisecond
	r.CreatedAt = time.UnixMilli(createdMS).UTC()
	r.UpdatedAt = time.UnixMilli(updatedMS).UTC()
	r.AnsweredAt = time.Time{}
	if answeredMS > 0 {
		r.AnsweredAt = time.UnixMilli(answeredMS).UTC()
	}
	r.Result = nil
	if result != "" {
		r.Result = json.RawMessage(result)
	}
	r.Error = nil
	if errText != "" {
		r.Error = new(ErrorInfo)
		if json.Unmarshal([]byte(errText), r.Error) != nil {
			r.Error = &ErrorInfo{Code: "unknown", Message: errText}
		}
	}
	return nil
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, DefaultTimeout)
}

// redact hides a password in a URL for error messages.
func redact(u string) string {
	at := strings.LastIndex(u, "@")
	scheme := strings.Index(u, "://")
	if at < 0 || scheme < 0 || at < scheme {
		return u
	}
	creds := u[scheme+3 : at]
	if user, _, ok := strings.Cut(creds, ":"); ok {
		return u[:scheme+3] + user + ":xxxxx" + u[at:]
	}
	return u
}

// translate turns a driver error into a ledger error, so that no driver type
// leaves the package: one that wraps ErrUnavailable when the database could
// not be reached, or else one that carries only the driver's message.
func (s *Store) translate(op string, err error) error {
	switch {
	case err == nil || isLedgerError(err):
		return err
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("ledger: %s: %w", op, context.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("ledger: %s: %w: %w", op, ErrUnavailable, context.DeadlineExceeded)
	}
	msg, unavailable := s.db.describe(err)
	if unavailable {
		return fmt.Errorf("ledger: %s: %w: %s", op, ErrUnavailable, msg)
	}
	return fmt.Errorf("ledger: %s: %s", op, msg)
}

// conflictTries bounds how often a batch aborted by a deadlock or a
// serialization conflict is run again before the error is returned (as
// ErrUnavailable: the caller retries it later).
const conflictTries = 5

// retryConflicts runs f until it succeeds, fails otherwise than by a
// conflict (see database.conflicted), or has been tried conflictTries times,
// with a short random pause between tries.
func (s *Store) retryConflicts(ctx context.Context, f func() error) error {
	for try := 1; ; try++ {
		err := f()
		if err == nil || try == conflictTries || !s.db.conflicted(err) {
			return err
		}
		pause := time.NewTimer(time.Duration(rand.Int64N(int64(time.Duration(try) * 10 * time.Millisecond))))
		select {
		case <-ctx.Done():
			pause.Stop()
			return err
		case <-pause.C:
		}
	}
}

func isLedgerError(err error) bool {
	for _, e := range []error{ErrNotFound, ErrFenced, ErrLeaseHeld, ErrMaterialMismatch, ErrNotIndeterminate, ErrUnavailable, ErrInvalidOutput, ErrResolved} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
