package ledger

// The ledger: claims and takeovers.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// Claim asks for the right to run one call.
type Claim struct {
	Key            string
	ConversationID string
	TurnIndex      int64
	Tool           string
	Ordinal        int64
	ArgsDigest     string // SHA-256 of the canonical args, hex
	ToolUseID      string // recorded as first_tool_use_id when the claim is new
	Tenant         string // the tenant whose call it is ("" the default)
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
	// without a second effect (a keyed_write; a transactional_write, whose
	// effect commits only with its fenced completion); it needs a Token. SQLite
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

// claimed is the row a claim statement returned and whether it inserted it.
type claimed struct {
	inserted bool
	row      Row
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
		got, err = s.db.claim(ctx, unique, s.answeredEveryMS())
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
	args := fenceArgs(f, namedArgs{"owner": owner, "lease_ms": lease.Milliseconds(), "new_token": token})
	err := s.db.queryRows(ctx, q.takeover, args, func(sc scanner) error {
		found = true
		return scanRow(sc, &row)
	})
	if err != nil {
		return Row{}, s.translate("takeover", err)
	}
	if found {
		return row, nil
	}
	// A takeover asked again after its answer was lost finds the row it
	// took, under its token (refused as fenced, the worker would hand the
	// job back and nobody would run the call until the new lease ran out).
	now, err := s.Get(ctx, f.Key)
	if err == nil && now.State == InFlight && now.Attempt == f.Attempt+1 && now.ClaimToken == token {
		return now, nil
	}
	return Row{}, refusal("takeover", f, true, now, err)
}

// whyNot explains a fenced write that changed nothing.
func (s *Store) whyNot(ctx context.Context, op string, f Fence) error {
	row, err := s.Get(ctx, f.Key)
	return refusal(op, f, false, row, err)
}

// refusal explains, by the row as read since (row, err), why the fenced
// write op of f (a takeover or not) changed nothing.
func refusal(op string, f Fence, takeover bool, row Row, err error) error {
	switch {
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("%w: %s (%s)", ErrNotFound, f.Key, op)
	case err != nil:
		return err
	case row.Attempt == f.Attempt && row.ClaimToken == f.Token && row.State == InFlight && takeover:
		// The takeover matched the claim and was refused: its lease ran
		// then, though it may have ended since (LeaseRemaining 0).
		return fmt.Errorf("%w: %s has %s left (%s)", ErrLeaseHeld, f.Key, row.LeaseRemaining.Round(time.Millisecond), op)
	case row.Attempt == f.Attempt && row.ClaimToken != f.Token:
		return fmt.Errorf("%w: %s %s with attempt %d, the row is %s at that attempt under another claim (the database lost the first in a crash)",
			ErrFenced, op, f.Key, f.Attempt, row.State)
	default:
		return fmt.Errorf("%w: %s %s with attempt %d, the row is %s at attempt %d", ErrFenced, op, f.Key, f.Attempt, row.State, row.Attempt)
	}
}
