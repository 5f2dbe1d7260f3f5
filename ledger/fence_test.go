package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/toolq/toolq/ledger"
)

// staleWrites are the fenced writes a holder that lost its claim may still
// try, each by name.
var staleWrites = []struct {
	op    string
	write func(s *ledger.Store, f ledger.Fence) error
}{
	{"complete", func(s *ledger.Store, f ledger.Fence) error {
		return s.Complete(context.Background(), f, json.RawMessage(`{"late":true}`))
	}},
	{"batch complete", func(s *ledger.Store, f ledger.Fence) error {
		errs, err := s.CompleteBatch(context.Background(), []ledger.Completion{{Fence: f, Output: json.RawMessage(`{"late":true}`)}})
		if err != nil {
			return err
		}
		return errs[0]
	}},
	{"fail", func(s *ledger.Store, f ledger.Fence) error {
		return s.Fail(context.Background(), f, ledger.ErrorInfo{Code: "late"})
	}},
	{"release", func(s *ledger.Store, f ledger.Fence) error { return s.Release(context.Background(), f) }},
	{"extend", func(s *ledger.Store, f ledger.Fence) error { return s.Extend(context.Background(), f, time.Hour) }},
	{"end lease", func(s *ledger.Store, f ledger.Fence) error {
		return s.EndLease(context.Background(), f, ledger.ErrorInfo{Code: "late"})
	}},
	{"mark indeterminate", func(s *ledger.Store, f ledger.Fence) error {
		return s.MarkIndeterminate(context.Background(), f, ledger.ErrorInfo{Code: "late"})
	}},
	{"takeover", func(s *ledger.Store, f ledger.Fence) error {
		_, err := s.Takeover(context.Background(), f, "late", newToken(), time.Minute)
		return err
	}},
}

// TestFencesNeverRepeatAfterRelease: A claims and pauses; B takes over and
// releases (not sent); C claims afresh. Neither A's nor B's fence may match
// C's claim, whichever write they try, and C's row stays as C left it.
func TestFencesNeverRepeatAfterRelease(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		for _, w := range staleWrites {
			c := newClaim(50 * time.Millisecond)
			a := mustClaim(t, s, c)
			waitExpired(t, s, c.Key)
			b, err := s.Takeover(ctx, a.Fence(), "B", newToken(), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Release(ctx, b.Fence()); err != nil {
				t.Fatal(err)
			}
			fresh := c
			fresh.Owner, fresh.Lease, fresh.ToolUseID = "C", time.Minute, "toolu_c"
			cRow := mustClaim(t, s, fresh)
			if cRow.Attempt <= b.Attempt {
				t.Errorf("C's claim has attempt %d; A had %d, B %d", cRow.Attempt, a.Attempt, b.Attempt)
			}
			for who, f := range map[string]ledger.Fence{"A": a.Fence(), "B": b.Fence()} {
				if err := w.write(s, f); !errors.Is(err, ledger.ErrFenced) {
					t.Errorf("%s's %s with attempt %d after C claimed at attempt %d: err = %v, want ErrFenced", who, w.op, f.Attempt, cRow.Attempt, err)
				}
			}
			got := mustGet(t, s, c.Key)
			if got.State != ledger.InFlight || got.Fence() != cRow.Fence() || got.Owner != "C" || got.FirstToolUseID != "toolu_c" ||
				got.Result != nil || got.Error != nil || got.LeaseRemaining < 50*time.Second {
				t.Errorf("C's row after stale %ss: %+v", w.op, got)
			}
			if err := s.Complete(ctx, cRow.Fence(), json.RawMessage(`{"ok":true}`)); err != nil {
				t.Errorf("C's complete after stale %ss: %v", w.op, err)
			}
		}
	})
}

// TestFencesNeverRepeatAfterResolveNotRun: an operator's not-run verdict
// releases the row; the holder of the indeterminate attempt must not match
// the next claim.
func TestFencesNeverRepeatAfterResolveNotRun(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		for _, w := range staleWrites {
			c := newClaim(time.Minute)
			d := mustClaim(t, s, c)
			if err := s.MarkIndeterminate(ctx, d.Fence(), ledger.ErrorInfo{Code: "reset"}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Resolve(ctx, c.Key, ledger.Resolution{NotRun: true, By: "op", Reason: "not in the downstream"}); err != nil {
				t.Fatal(err)
			}
			e := mustClaim(t, s, c)
			if e.Attempt <= d.Attempt {
				t.Errorf("claim after resolve --not-run has attempt %d, the resolved one had %d", e.Attempt, d.Attempt)
			}
			if err := w.write(s, d.Fence()); !errors.Is(err, ledger.ErrFenced) {
				t.Errorf("the resolved holder's %s with attempt %d: err = %v, want ErrFenced", w.op, d.Attempt, err)
			}
			if got := mustGet(t, s, c.Key); got.State != ledger.InFlight || got.Fence() != e.Fence() || got.Error != nil || got.LeaseRemaining < 50*time.Second {
				t.Errorf("the new claim's row after a stale %s: %+v", w.op, got)
			}
		}
	})
}
