package ledger

// The ledger: the writes of a claim's holder, each fenced by the claim.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"
	"unicode/utf8"
)

// Extend renews the lease of an in-flight claim to lease from now (by the
// database's clock). ErrFenced or ErrNotFound: the claim is no longer ours.
func (s *Store) Extend(ctx context.Context, f Fence, lease time.Duration) error {
	return s.fenced(ctx, "extend", f, s.db.sql().extend, namedArgs{"lease_ms": lease.Milliseconds()})
}

// Complete records the tool's output and settles the row as completed. An
// output that is not valid JSON in UTF-8 is refused with ErrInvalidOutput.
func (s *Store) Complete(ctx context.Context, f Fence, output json.RawMessage) error {
	if err := checkOutput("complete", f.Key, output); err != nil {
		return err
	}
	return s.fenced(ctx, "complete", f, s.db.sql().complete, namedArgs{"result": string(output)})
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
			errs[i] = s.whyNot(ctx, "complete", c.Fence)
		}
	}
	return errs, nil
}

// Fail settles the row as failed: the downstream answered no, and that answer
// is the call's result from now on.
func (s *Store) Fail(ctx context.Context, f Fence, e ErrorInfo) error {
	return s.fenced(ctx, "fail", f, s.db.sql().fail, namedArgs{"error": encodeError(e)})
}

// EndLease ends the lease now and records why, leaving the row in flight: a
// keyed write whose outcome is ambiguous is retried by the next delivery,
// which takes over with the same key.
func (s *Store) EndLease(ctx context.Context, f Fence, e ErrorInfo) error {
	return s.fenced(ctx, "end lease", f, s.db.sql().endLease, namedArgs{"error": encodeError(e)})
}

// MarkIndeterminate settles the row as indeterminate: an unkeyed write whose
// outcome is unknown, left for an operator to resolve.
func (s *Store) MarkIndeterminate(ctx context.Context, f Fence, e ErrorInfo) error {
	return s.fenced(ctx, "mark indeterminate", f, s.db.sql().indeterminate, namedArgs{"error": encodeError(e)})
}

// CountFailures records on the claim's row that n tries of the call have
// failed so far. The worker calls it before it gives a failed try back
// (Release, EndLease), and compares n with its delivery limit; deliveries
// that only waited never reach it. Errors: ErrFenced or ErrNotFound when the
// claim is no longer this fence's.
func (s *Store) CountFailures(ctx context.Context, f Fence, n int64) error {
	return s.fenced(ctx, "count failures", f, s.db.sql().failures, namedArgs{"failures": n})
}

// Release gives the claim up: the tool was not sent, so nothing happened and
// the next delivery may claim the key afresh. The row stays, released, and
// counts as absent for every reader (Get gives ErrNotFound) but keeps its
// attempt: the next claim takes the attempt after it, so this fence, and any
// older one, can never match the new claim.
func (s *Store) Release(ctx context.Context, f Fence) error {
	return s.fenced(ctx, "release", f, s.db.sql().release, nil)
}

// fenced runs a write of the holder of the claim f, with the claim's
// arguments and more.
func (s *Store) fenced(ctx context.Context, op string, f Fence, query string, more namedArgs) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	n, err := s.db.exec(ctx, query, fenceArgs(f, more))
	if err != nil {
		return s.translate(op, err)
	}
	if n == 0 {
		return s.whyNot(ctx, op, f)
	}
	return nil
}

// Answered records that the settled row of key answered a call outside a
// claim (a claim records it itself), so that retention counts from this
// answer (see Row.AnsweredAt): at most one write an hour a row, none while
// the row settled within the hour. A row not settled, or not there, is
// left alone.
func (s *Store) Answered(ctx context.Context, key string) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	_, err := s.db.exec(ctx, s.db.sql().answered, namedArgs{"key": key, "every_ms": s.answeredEveryMS()})
	return s.translate("answered", err)
}
