package ledger_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

func TestMain(m *testing.M) {
	if helperMain() {
		return
	}
	testenv.Main(m)
}

// eachBackend runs the test body once per backend, as subtests named
// "postgres", "postgres-read-first" (its claims read settled rows first,
// as they do while most claims are duplicates), "sqlite" and "pgbouncer"
// (Postgres through PgBouncer in transaction mode: see
// pgbouncer_test.go), each on a fresh, migrated database.
func eachBackend(t *testing.T, body func(t *testing.T, s *ledger.Store)) {
	t.Helper()
	for _, backend := range []string{"postgres", "postgres-read-first", "sqlite", "pgbouncer"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			body(t, openStore(t, backend))
		})
	}
}

func openStore(t *testing.T, backend string) *ledger.Store { return openStoreTB(t, backend) }

func openStoreTB(t testing.TB, backend string) *ledger.Store {
	t.Helper()
	ctx := context.Background()
	var s *ledger.Store
	var err error
	switch backend {
	case "postgres":
		s, err = ledger.OpenPostgres(ctx, testenv.Postgres(t)+"&pool_max_conns=16")
	case "postgres-read-first":
		if s, err = ledger.OpenPostgres(ctx, testenv.Postgres(t)+"&pool_max_conns=16"); err == nil {
			ledger.ReadSettledFirst(s)
		}
	case "sqlite":
		s, err = ledger.OpenSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	case "pgbouncer":
		s, err = ledger.OpenPostgres(ctx, testenv.PgBouncerPostgres(t)+"&pool_max_conns=16")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s.SetAnsweredEvery(100 * time.Millisecond) // the tests' retentions are seconds
	return s
}

var keySeq atomic.Int64

// newClaim returns a claim for a fresh key with a lease of d.
func newClaim(d time.Duration) ledger.Claim {
	n := keySeq.Add(1)
	return ledger.Claim{
		Key:            fmt.Sprintf("k%031d", n),
		ConversationID: "conv-1",
		TurnIndex:      n,
		Tool:           "send_payment",
		ArgsDigest:     "digest",
		ToolUseID:      fmt.Sprintf("toolu_%d", n),
		Owner:          "test",
		Lease:          d,
		TraceID:        "0af7651916cd43dd8448eb211c80319c",
		SpanID:         "b7ad6b7169203331",
	}
}

func claimOne(t *testing.T, s *ledger.Store, c ledger.Claim) ledger.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), []ledger.Claim{c})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 {
		t.Fatalf("%d results for one claim", len(res))
	}
	return res[0]
}

func mustClaim(t *testing.T, s *ledger.Store, c ledger.Claim) ledger.Row {
	t.Helper()
	r := claimOne(t, s, c)
	if !r.Claimed || r.Err != nil {
		t.Fatalf("claim %s: claimed=%v err=%v row=%+v", c.Key, r.Claimed, r.Err, r.Row)
	}
	return r.Row
}

func mustGet(t *testing.T, s *ledger.Store, key string) ledger.Row {
	t.Helper()
	row, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return row
}

// waitExpired waits, with a deadline, until the database says the lease of
// key has run out.
func waitExpired(t *testing.T, s *ledger.Store, key string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the lease of "+key+" to run out", func() bool {
		row := mustGet(t, s, key)
		return row.LeaseExpired()
	})
}

func isErr(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("err = %v, want %v", err, want)
	}
}

func TestClaimThenDuplicate(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c := newClaim(time.Minute)
		row := mustClaim(t, s, c)
		if row.State != ledger.InFlight || row.Attempt != 1 || row.FirstToolUseID != c.ToolUseID ||
			row.TraceID != c.TraceID || row.SpanID != c.SpanID || row.LeaseRemaining <= 50*time.Second {
			t.Fatalf("new row %+v", row)
		}
		dup := c
		dup.ToolUseID = "toolu_other"
		r := claimOne(t, s, dup)
		if r.Claimed || r.Err != nil || r.Row.State != ledger.InFlight || r.Row.FirstToolUseID != c.ToolUseID || r.Row.LeaseExpired() {
			t.Fatalf("duplicate of an in-flight claim: %+v", r)
		}
		out := json.RawMessage(`{"id":"pay_1", "amount": 1}`)
		if err := s.Complete(ctx, row.Fence(), out); err != nil {
			t.Fatal(err)
		}
		r = claimOne(t, s, dup)
		if r.Claimed || r.Row.State != ledger.Completed || string(r.Row.Result) != string(out) || r.Row.Attempt != 1 {
			t.Fatalf("duplicate of a completed claim: %+v", r)
		}
		// Completing twice is refused: the row is settled.
		isErr(t, s.Complete(ctx, row.Fence(), out), ledger.ErrFenced)
	})
}

func TestFailIsTheResult(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		c := newClaim(time.Minute)
		row := mustClaim(t, s, c)
		if err := s.Fail(context.Background(), row.Fence(), ledger.ErrorInfo{Code: "card_declined", Message: "no"}); err != nil {
			t.Fatal(err)
		}
		r := claimOne(t, s, c)
		if r.Claimed || r.Row.State != ledger.Failed || r.Row.Error == nil || r.Row.Error.Code != "card_declined" {
			t.Fatalf("after fail: %+v", r)
		}
	})
}

// TestClaimRace: 64 goroutines over at least 8 connections claim one key;
// exactly one wins, and every other sees the winner's row.
func TestClaimRace(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		for round := range 5 {
			c := newClaim(time.Minute)
			var wins atomic.Int32
			var wg sync.WaitGroup
			start := make(chan struct{})
			errs := make(chan error, 64)
			for g := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					mine := c
					mine.ToolUseID = fmt.Sprintf("toolu_%d", g)
					<-start
					res, err := s.Claim(context.Background(), []ledger.Claim{mine})
					if err != nil {
						errs <- err
						return
					}
					if res[0].Claimed {
						wins.Add(1)
					} else if res[0].Row.Attempt != 1 || res[0].Row.State != ledger.InFlight {
						errs <- fmt.Errorf("loser saw %+v", res[0].Row)
					}
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if wins.Load() != 1 {
				t.Fatalf("round %d: %d claims won, want exactly 1", round, wins.Load())
			}
		}
	})
}

func TestMaterialMismatch(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		c := newClaim(time.Minute)
		row := mustClaim(t, s, c)
		if err := s.Complete(context.Background(), row.Fence(), json.RawMessage(`{"secret":"for conv-1 only"}`)); err != nil {
			t.Fatal(err)
		}
		for name, change := range map[string]func(*ledger.Claim){
			"conversation": func(c *ledger.Claim) { c.ConversationID = "conv-2" },
			"turn":         func(c *ledger.Claim) { c.TurnIndex++ },
			"tool":         func(c *ledger.Claim) { c.Tool = "void_payment" },
			"ordinal":      func(c *ledger.Claim) { c.Ordinal = 9 },
			"args":         func(c *ledger.Claim) { c.ArgsDigest = "other" },
		} {
			other := c
			change(&other)
			r := claimOne(t, s, other)
			if !errors.Is(r.Err, ledger.ErrMaterialMismatch) || r.Claimed || r.Row.Result != nil || r.Row.Key != "" {
				t.Fatalf("%s differs: %+v", name, r)
			}
		}
	})
}

func TestTakeoverFencesTheStaleHolder(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c := newClaim(300 * time.Millisecond)
		stale := mustClaim(t, s, c)
		// While the lease runs nobody may take over.
		_, err := s.Takeover(ctx, stale.Fence(), "taker", newToken(), time.Minute)
		isErr(t, err, ledger.ErrLeaseHeld)
		waitExpired(t, s, c.Key)
		taken, err := s.Takeover(ctx, stale.Fence(), "taker", newToken(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if taken.Attempt != 2 || taken.Owner != "taker" || taken.LeaseExpired() || taken.FirstToolUseID != c.ToolUseID {
			t.Fatalf("taken over: %+v", taken)
		}
		f := stale.Fence()
		isErr(t, s.Complete(ctx, f, json.RawMessage(`{}`)), ledger.ErrFenced)
		isErr(t, s.Fail(ctx, f, ledger.ErrorInfo{Code: "x"}), ledger.ErrFenced)
		isErr(t, s.Release(ctx, f), ledger.ErrFenced)
		isErr(t, s.Extend(ctx, f, time.Minute), ledger.ErrFenced)
		isErr(t, s.EndLease(ctx, f, ledger.ErrorInfo{Code: "x"}), ledger.ErrFenced)
		isErr(t, s.MarkIndeterminate(ctx, f, ledger.ErrorInfo{Code: "x"}), ledger.ErrFenced)
		errs, err := s.CompleteBatch(ctx, []ledger.Completion{{Fence: f, Output: json.RawMessage(`{}`)}})
		if err != nil {
			t.Fatal(err)
		}
		isErr(t, errs[0], ledger.ErrFenced)
		_, err = s.Takeover(ctx, f, "zombie", newToken(), time.Minute)
		isErr(t, err, ledger.ErrFenced)
		// The row is the new holder's, untouched by the stale one.
		row := mustGet(t, s, c.Key)
		if row.State != ledger.InFlight || row.Attempt != 2 || row.Owner != "taker" || row.Result != nil {
			t.Fatalf("row after the stale holder's writes: %+v", row)
		}
		if err := s.Complete(ctx, taken.Fence(), json.RawMessage(`{"ok":true}`)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestTakeoverRace(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		c := newClaim(100 * time.Millisecond)
		row := mustClaim(t, s, c)
		waitExpired(t, s, c.Key)
		var wins atomic.Int32
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.Takeover(context.Background(), row.Fence(), fmt.Sprintf("taker-%d", g), newToken(), time.Minute)
				switch {
				case err == nil:
					wins.Add(1)
				case !errors.Is(err, ledger.ErrFenced):
					t.Errorf("loser: %v", err)
				}
			}()
		}
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("%d takers won, want 1", wins.Load())
		}
		if got := mustGet(t, s, c.Key); got.Attempt != 2 {
			t.Fatalf("attempt %d after one takeover", got.Attempt)
		}
	})
}

func TestReleaseLetsTheKeyBeClaimedAgain(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c := newClaim(time.Minute)
		row := mustClaim(t, s, c)
		if err := s.Release(ctx, row.Fence()); err != nil {
			t.Fatal(err)
		}
		_, err := s.Get(ctx, c.Key)
		isErr(t, err, ledger.ErrNotFound)
		isErr(t, s.Complete(ctx, row.Fence(), json.RawMessage(`{}`)), ledger.ErrNotFound)
		again := mustClaim(t, s, c)
		if again.Attempt != 2 || again.State != ledger.InFlight || again.Error != nil {
			t.Fatalf("claim after release: %+v", again)
		}
	})
}

func TestEndLeaseAndExtend(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c := newClaim(2 * time.Second)
		row := mustClaim(t, s, c)
		if err := s.Extend(ctx, row.Fence(), time.Hour); err != nil {
			t.Fatal(err)
		}
		if got := mustGet(t, s, c.Key); got.LeaseRemaining < 59*time.Minute {
			t.Fatalf("extended lease: %v left", got.LeaseRemaining)
		}
		if err := s.EndLease(ctx, row.Fence(), ledger.ErrorInfo{Code: "timeout", Message: "no answer in 5s"}); err != nil {
			t.Fatal(err)
		}
		got := mustGet(t, s, c.Key)
		if !got.LeaseExpired() || got.State != ledger.InFlight || got.Error == nil || got.Error.Code != "timeout" {
			t.Fatalf("after EndLease: %+v", got)
		}
		// The next delivery takes over at once, with the same key.
		taken, err := s.Takeover(ctx, got.Fence(), "next", newToken(), time.Minute)
		if err != nil || taken.Attempt != 2 {
			t.Fatalf("takeover after EndLease: %+v %v", taken, err)
		}
	})
}

func TestIndeterminateAndResolve(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		settle := func() ledger.Claim {
			c := newClaim(time.Minute)
			row := mustClaim(t, s, c)
			if err := s.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset", Message: "connection reset mid-response"}); err != nil {
				t.Fatal(err)
			}
			return c
		}
		a, b := settle(), settle()
		if r := claimOne(t, s, a); r.Claimed || r.Row.State != ledger.Indeterminate {
			t.Fatalf("duplicate of an indeterminate row: %+v", r)
		}
		rows, err := s.List(ctx, ledger.Filter{State: ledger.Indeterminate})
		if err != nil || len(rows) != 2 {
			t.Fatalf("list indeterminate: %d rows, %v", len(rows), err)
		}
		if _, err := s.Resolve(ctx, a.Key, ledger.Resolution{Output: json.RawMessage(`{"ticket":"T-1"}`), By: "op", Reason: "ticket found"}); err != nil {
			t.Fatal(err)
		}
		if r := claimOne(t, s, a); r.Row.State != ledger.Completed || string(r.Row.Result) != `{"ticket":"T-1"}` {
			t.Fatalf("after resolve completed: %+v", r)
		}
		if _, err := s.Resolve(ctx, b.Key, ledger.Resolution{NotRun: true, By: "op", Reason: "not in the downstream"}); err != nil {
			t.Fatal(err)
		}
		if r := claimOne(t, s, b); !r.Claimed {
			t.Fatalf("after resolve not-run the key is claimable again: %+v", r)
		}
		isErr(t, resolveErr(s.Resolve(ctx, a.Key, ledger.Resolution{NotRun: true, By: "op", Reason: "not in the downstream"})), ledger.ErrResolved)
		isErr(t, resolveErr(s.Resolve(ctx, "missing", ledger.Resolution{NotRun: true, By: "op", Reason: "not in the downstream"})), ledger.ErrNotFound)
		if _, err := s.Resolve(ctx, a.Key, ledger.Resolution{Output: json.RawMessage(`{bad`), By: "op", Reason: "x"}); err == nil {
			t.Fatal("invalid output JSON accepted")
		}
	})
}

func resolveErr[T any](_ T, err error) error { return err }

// TestResolveIsRecordedAndIdempotent: a resolution is recorded in the row's
// history (who, why, the error it settled), survives the release and the
// claim after it, is a no-op when repeated, and a different decision is
// refused with the current state.
func TestResolveIsRecordedAndIdempotent(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		indeterminate := func() ledger.Claim {
			c := newClaim(time.Minute)
			row := mustClaim(t, s, c)
			if err := s.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset", Message: "reset"}); err != nil {
				t.Fatal(err)
			}
			return c
		}
		done, notRun := indeterminate(), indeterminate()
		out := ledger.Resolution{Output: json.RawMessage(`{"ticket":"T-1","n":1}`), By: "alice", Reason: "found T-1 in the tracker"}
		if changed, err := s.Resolve(ctx, done.Key, out); !changed || err != nil {
			t.Fatalf("resolve: %v %v", changed, err)
		}
		row := mustGet(t, s, done.Key)
		ev := row.LastResolution()
		if len(row.History) != 1 || ev == nil || ev.By != "alice" || ev.Reason != out.Reason || ev.Decision != ledger.DecisionCompleted ||
			ev.From != ledger.Indeterminate || ev.Error == nil || ev.Error.Code != "reset" || ev.At.IsZero() {
			t.Fatalf("history %+v", row.History)
		}
		same := out
		same.Output, same.By = json.RawMessage(`{"n":1,"ticket":"T-1"}`), "bob"
		if changed, err := s.Resolve(ctx, done.Key, same); changed || err != nil {
			t.Fatalf("the same resolution again: %v %v", changed, err)
		}
		if got := mustGet(t, s, done.Key); len(got.History) != 1 {
			t.Fatalf("a no-op resolution was recorded: %+v", got.History)
		}
		other := out
		other.Output = json.RawMessage(`{"ticket":"T-2"}`)
		_, err := s.Resolve(ctx, done.Key, other)
		isErr(t, err, ledger.ErrResolved)
		if !strings.Contains(err.Error(), "alice") || !strings.Contains(err.Error(), "completed") {
			t.Fatalf("refusal does not say the current state: %v", err)
		}

		nr := ledger.Resolution{NotRun: true, By: "alice", Reason: "no ticket in the tracker"}
		if changed, err := s.Resolve(ctx, notRun.Key, nr); !changed || err != nil {
			t.Fatalf("resolve not-run: %v %v", changed, err)
		}
		if changed, err := s.Resolve(ctx, notRun.Key, nr); changed || err != nil {
			t.Fatalf("not-run again on the released row: %v %v", changed, err)
		}
		isErr(t, resolveErr(s.Resolve(ctx, notRun.Key, out)), ledger.ErrResolved)
		again := mustClaim(t, s, notRun)
		if err := s.Complete(ctx, again.Fence(), json.RawMessage(`{"ticket":"T-9"}`)); err != nil {
			t.Fatal(err)
		}
		row = mustGet(t, s, notRun.Key)
		if ev := row.LastResolution(); row.State != ledger.Completed || ev == nil || ev.Decision != ledger.DecisionNotRun || ev.Reason != nr.Reason {
			t.Fatalf("after the rerun: %s %+v", row.State, row.History)
		}
		for _, bad := range []ledger.Resolution{{NotRun: true, By: "alice"}, {NotRun: true, Reason: "why"}} {
			if _, err := s.Resolve(ctx, indeterminate().Key, bad); err == nil {
				t.Errorf("%+v accepted", bad)
			}
		}
	})
}

// TestARepeatedResolutionDoesNotReleaseTheAttemptAfterIt: an operator
// resolves an indeterminate unkeyed write not-run; the call runs again
// (attempt 2) and its outcome is uncertain again: indeterminate. The same
// resolution again (a retry of a command whose answer was lost, a second
// operator working the same page) is refused, without an attempt or with
// attempt 1: it would release attempt 2, whose outcome nobody looked at,
// and the call would run a third time. Naming attempt 2 resolves it.
func TestARepeatedResolutionDoesNotReleaseTheAttemptAfterIt(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c := newClaim(time.Minute)
		row := mustClaim(t, s, c)
		if err := s.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset", Message: "reset"}); err != nil {
			t.Fatal(err)
		}
		nr := ledger.Resolution{NotRun: true, By: "alice", Reason: "no ticket in the tracker for attempt 1"}
		if changed, err := s.Resolve(ctx, c.Key, nr); !changed || err != nil {
			t.Fatalf("resolve not-run: %v %v", changed, err)
		}
		again := mustClaim(t, s, c) // attempt 2 runs
		if err := s.MarkIndeterminate(ctx, again.Fence(), ledger.ErrorInfo{Code: "reset", Message: "reset again"}); err != nil {
			t.Fatal(err)
		}
		// The same resolution again.
		changed, err := s.Resolve(ctx, c.Key, nr)
		r := claimOne(t, s, c) // the next delivery of the call
		if changed || r.Claimed {
			t.Fatalf("the same not-run resolution repeated: changed=%v err=%v; attempt %d's uncertain outcome was released, and the next delivery claims the call again: claimed=%v attempt=%d",
				changed, err, again.Attempt, r.Claimed, r.Row.Attempt)
		}
		isErr(t, err, ledger.ErrOtherAttempt)
		first := nr
		first.Attempt = 1
		isErr(t, resolveErr(s.Resolve(ctx, c.Key, first)), ledger.ErrOtherAttempt)
		isErr(t, resolveErr(s.Resolve(ctx, c.Key, ledger.Resolution{Output: json.RawMessage(`{}`), By: "bob", Reason: "r", Attempt: 3})), ledger.ErrOtherAttempt)
		if r := claimOne(t, s, c); r.Claimed || r.Row.State != ledger.Indeterminate {
			t.Fatalf("after refused resolutions: %+v", r)
		}
		second := ledger.Resolution{Output: json.RawMessage(`{"vote":2}`), By: "bob", Reason: "attempt 2's vote is in the tracker", Attempt: 2}
		if changed, err := s.Resolve(ctx, c.Key, second); !changed || err != nil {
			t.Fatalf("resolve attempt 2: %v %v", changed, err)
		}
		got := mustGet(t, s, c.Key)
		if ev := got.LastResolution(); got.State != ledger.Completed || len(got.History) != 2 || ev.Attempt != 2 || got.History[0].Attempt != 1 {
			t.Fatalf("after resolving attempt 2: %s %+v", got.State, got.History)
		}
		if changed, err := s.Resolve(ctx, c.Key, second); changed || err != nil {
			t.Fatalf("attempt 2's resolution again: %v %v", changed, err)
		}
	})
}

// TestAHolderLostIsResolvedAtTheAttemptTheRowShows: an unkeyed write's
// holder stops mid-call; the next delivery takes the row over (attempt
// 1 -> 2) and marks it indeterminate, "w1 stopped during attempt 1"
// (worker/delivery.go, holderLost). The outcome to check is attempt 1's,
// and the attempt named is the row's, 2, as `ledger show` prints it: one
// rule, whatever the error says. Attempt 1 is refused.
func TestAHolderLostIsResolvedAtTheAttemptTheRowShows(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c := newClaim(50 * time.Millisecond)
		row := mustClaim(t, s, c)          // attempt 1: sent, then the worker died
		time.Sleep(100 * time.Millisecond) // its lease runs out
		taken, err := s.Takeover(ctx, row.Fence(), "w2", "tok2", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		info := ledger.ErrorInfo{Code: "holder_lost", Message: "w1 stopped during attempt 1; whether the call took effect is unknown"}
		if err := s.MarkIndeterminate(ctx, taken.Fence(), info); err != nil {
			t.Fatal(err)
		}
		got := mustGet(t, s, c.Key)
		if got.State != ledger.Indeterminate || got.Attempt != 2 {
			t.Fatalf("row: %s at attempt %d, want indeterminate at 2", got.State, got.Attempt)
		}
		r := ledger.Resolution{Output: json.RawMessage(`{"id":"T-9"}`), By: "alice", Reason: "attempt 1's ticket T-9 is in the tracker", Attempt: 1}
		isErr(t, resolveErr(s.Resolve(ctx, c.Key, r)), ledger.ErrOtherAttempt)
		r.Attempt = got.Attempt
		if changed, err := s.Resolve(ctx, c.Key, r); !changed || err != nil {
			t.Fatalf("resolving at the row's attempt %d: %v %v", got.Attempt, changed, err)
		}
	})
}

// TestAResolutionOfAnAttemptNeverResolvedIsNoRepeat: attempt 1 was
// resolved not run; the call ran again, attempt 2, in flight or completed.
// Resolving attempt 2 not run is no repeat of attempt 1's resolution
// ("already resolved this way") but of an attempt never resolved:
// refused, and the row is left as it is.
func TestAResolutionOfAnAttemptNeverResolvedIsNoRepeat(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		for _, completed := range []bool{false, true} {
			ctx := context.Background()
			c := newClaim(time.Minute)
			row := mustClaim(t, s, c)
			if err := s.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset", Message: "reset"}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Resolve(ctx, c.Key, ledger.Resolution{NotRun: true, By: "alice", Reason: "nothing for attempt 1", Attempt: 1}); err != nil {
				t.Fatal(err)
			}
			again := mustClaim(t, s, c) // attempt 2 runs
			state := ledger.InFlight
			if completed {
				if err := s.Complete(ctx, again.Fence(), json.RawMessage(`{"ok":true}`)); err != nil {
					t.Fatal(err)
				}
				state = ledger.Completed
			}
			changed, err := s.Resolve(ctx, c.Key, ledger.Resolution{NotRun: true, By: "bob", Reason: "nothing for attempt 2", Attempt: again.Attempt})
			if err == nil && !changed {
				t.Fatalf("resolving attempt %d, %s, never resolved: changed=false err=nil (\"already resolved this way\")", again.Attempt, state)
			}
			isErr(t, err, ledger.ErrOtherAttempt)
			if got := mustGet(t, s, c.Key); got.State != state || got.Attempt != again.Attempt {
				t.Fatalf("after the refused resolution: %s at attempt %d, want %s at %d", got.State, got.Attempt, state, again.Attempt)
			}
		}
	})
}

// TestOfConcurrentResolutionsOfARowOneChangesIt: operators resolving one
// row at once with different outputs: exactly one changes it.
func TestOfConcurrentResolutionsOfARowOneChangesIt(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		for k := 0; k < 20; k++ {
			c := newClaim(time.Minute)
			row := mustClaim(t, s, c)
			if err := s.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset", Message: "reset"}); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var changed atomic.Int32
			start := make(chan struct{})
			for i := 0; i < 8; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					r := ledger.Resolution{Output: json.RawMessage(`{"op":` + strconv.Itoa(i) + `}`), By: "op" + strconv.Itoa(i), Reason: "found it"}
					if ok, _ := s.Resolve(ctx, c.Key, r); ok {
						changed.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			if n := changed.Load(); n != 1 {
				t.Fatalf("key %s: %d of 8 concurrent resolutions with different outputs changed the row; want 1", c.Key, n)
			}
		}
	})
}

// TestListFilters: List selects by tool, conversation, tenant, state and age.
func TestListFilters(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		isErr(t, resolveErr(s.OldestInFlight(ctx)), ledger.ErrNotFound)
		conv := fmt.Sprintf("conv-filter-%d", keySeq.Add(1))
		for i, tool := range []string{"send_payment", "create_ticket", "create_ticket"} {
			c := newClaim(time.Minute)
			c.ConversationID, c.Tool = conv, tool
			if i == 2 {
				c.Tenant = "acme"
			}
			mustClaim(t, s, c)
		}
		if _, err := s.OldestInFlight(ctx); err != nil {
			t.Fatalf("oldest in flight: %v", err)
		}
		for _, c := range []struct {
			f    ledger.Filter
			want int
		}{
			{ledger.Filter{ConversationID: conv}, 3},
			{ledger.Filter{ConversationID: conv, Tool: "create_ticket"}, 2},
			{ledger.Filter{ConversationID: conv, Tenant: "acme"}, 1},
			{ledger.Filter{ConversationID: conv, Tenant: "globex"}, 0},
			{ledger.Filter{ConversationID: conv, State: ledger.Completed}, 0},
			{ledger.Filter{ConversationID: conv, NewerThan: time.Hour}, 3},
			{ledger.Filter{ConversationID: conv, OlderThan: time.Hour}, 0},
			{ledger.Filter{ConversationID: conv, OlderThan: 40 * 24 * time.Hour}, 0},
			{ledger.Filter{ConversationID: conv, Stale: true}, 0},
			{ledger.Filter{ConversationID: conv, Limit: 1}, 1},
		} {
			rows, err := s.List(ctx, c.f)
			if err != nil || len(rows) != c.want {
				t.Errorf("%+v: %d rows, want %d (%v)", c.f, len(rows), c.want, err)
			}
		}
	})
}

// TestPurgeByTool: PurgeOnly and PurgeExcept split a purge by tool, so that
// each tool's rows can be kept for its own retention.
func TestPurgeByTool(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		n := keySeq.Add(1)
		a, b, c := fmt.Sprintf("tool_a%d", n), fmt.Sprintf("tool_b%d", n), fmt.Sprintf("tool_c%d", n)
		for _, tool := range []string{a, b, c} {
			cl := newClaim(time.Minute)
			cl.Tool = tool
			row := mustClaim(t, s, cl)
			if err := s.Complete(ctx, row.Fence(), json.RawMessage(`{}`)); err != nil {
				t.Fatal(err)
			}
		}
		count := func(opts ...ledger.PurgeOption) int64 {
			n, err := s.PurgeCount(ctx, 5*time.Millisecond, opts...)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		testenv.Eventually(t, 10*time.Second, "the rows to age", func() bool {
			return count(ledger.PurgeOnly(a)) == 1 && count(ledger.PurgeOnly(b)) == 1 && count(ledger.PurgeOnly(c)) == 1
		})
		if got := count(ledger.PurgeOnly(a), ledger.PurgeExcept(a)); got != 0 {
			t.Errorf("only and except the same tool: %d", got)
		}
		all := count()
		if got := count(ledger.PurgeExcept(a, b)); got != all-2 {
			t.Errorf("except two: %d of %d", got, all)
		}
		if got, err := s.Purge(ctx, 5*time.Millisecond, 0, ledger.PurgeExcept(a)); err != nil || got != all-1 {
			t.Fatalf("purge except %s: %d %v", a, got, err)
		}
		rows, err := s.List(ctx, ledger.Filter{Tool: a})
		if err != nil || len(rows) != 1 {
			t.Fatalf("the kept tool's row: %+v %v", rows, err)
		}
	})
}

// TestBatchClaim: one batch mixes new keys, a completed key, an in-flight
// key, a key given twice and a key with other material.
func TestBatchClaim(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		done, busy := newClaim(time.Minute), newClaim(time.Minute)
		doneRow := mustClaim(t, s, done)
		if err := s.Complete(ctx, doneRow.Fence(), json.RawMessage(`{"done":1}`)); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, s, busy)
		fresh1, fresh2 := newClaim(time.Minute), newClaim(time.Minute)
		twice := fresh1
		twice.ToolUseID = "toolu_twice"
		clash := done
		clash.ArgsDigest = "another call"
		batch := []ledger.Claim{fresh1, done, busy, twice, fresh2, clash}
		res, err := s.Claim(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		want := []struct {
			claimed bool
			state   ledger.State
			err     error
		}{
			{true, ledger.InFlight, nil},
			{false, ledger.Completed, nil},
			{false, ledger.InFlight, nil},
			{false, ledger.InFlight, nil},
			{true, ledger.InFlight, nil},
			{false, "", ledger.ErrMaterialMismatch},
		}
		for i, w := range want {
			r := res[i]
			if r.Claimed != w.claimed || r.Row.State != w.state || !errors.Is(r.Err, w.err) {
				t.Errorf("batch[%d] (%s): claimed=%v state=%q err=%v", i, batch[i].Key, r.Claimed, r.Row.State, r.Err)
			}
		}
		if string(res[1].Row.Result) != `{"done":1}` || res[3].Row.FirstToolUseID != fresh1.ToolUseID {
			t.Errorf("rows: %+v / %+v", res[1].Row, res[3].Row)
		}
		// Batched completion of the two new claims.
		errs, err := s.CompleteBatch(ctx, []ledger.Completion{
			{Fence: res[0].Row.Fence(), Output: json.RawMessage(`{"n":1}`)},
			{Fence: res[4].Row.Fence(), Output: json.RawMessage(`{"n":2}`)},
			{Fence: doneRow.Fence(), Output: json.RawMessage(`{"n":3}`)},
		})
		if err != nil || errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], ledger.ErrFenced) {
			t.Fatalf("CompleteBatch: %v %v", errs, err)
		}
		if got := mustGet(t, s, fresh2.Key); got.State != ledger.Completed || string(got.Result) != `{"n":2}` {
			t.Fatalf("after CompleteBatch: %+v", got)
		}
	})
}

func TestListAndCounts(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		if rows, err := s.List(ctx, ledger.Filter{}); err != nil || rows == nil || len(rows) != 0 {
			t.Fatalf("empty ledger: %v %v", rows, err)
		}
		short := newClaim(50 * time.Millisecond)
		mustClaim(t, s, short)
		mustClaim(t, s, newClaim(time.Hour))
		doneRow := mustClaim(t, s, newClaim(time.Hour))
		if err := s.Complete(ctx, doneRow.Fence(), json.RawMessage(`1`)); err != nil {
			t.Fatal(err)
		}
		releasedRow := mustClaim(t, s, newClaim(time.Hour))
		if err := s.Release(ctx, releasedRow.Fence()); err != nil {
			t.Fatal(err)
		}
		waitExpired(t, s, short.Key)
		stale, err := s.List(ctx, ledger.Filter{Stale: true})
		if err != nil || len(stale) != 1 || stale[0].Key != short.Key {
			t.Fatalf("stale: %+v %v", stale, err)
		}
		inflight, _ := s.List(ctx, ledger.Filter{State: ledger.InFlight})
		if len(inflight) != 2 {
			t.Fatalf("in flight: %d rows", len(inflight))
		}
		counts, err := s.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if all, _ := s.List(ctx, ledger.Filter{}); len(all) != 3 {
			t.Fatalf("all rows: %d, want 3 (a released row is not listed)", len(all))
		}
		if len(counts) != 6 || counts["in_flight"] != 2 || counts["completed"] != 1 || counts["stale"] != 1 || counts["failed"] != 0 {
			t.Fatalf("counts %v", counts)
		}
		if _, err := s.List(ctx, ledger.Filter{State: "bogus"}); err == nil {
			t.Fatal("unknown state accepted")
		}
	})
}

func TestPurgeLeavesUnfinishedRows(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		var old []string
		for i := range 25 {
			row := mustClaim(t, s, newClaim(time.Hour))
			var err error
			if i%2 == 0 {
				err = s.Complete(ctx, row.Fence(), json.RawMessage(`{}`))
			} else {
				err = s.Fail(ctx, row.Fence(), ledger.ErrorInfo{Code: "no"})
			}
			if err != nil {
				t.Fatal(err)
			}
			old = append(old, row.Key)
		}
		releasedRow := mustClaim(t, s, newClaim(time.Hour))
		if err := s.Release(ctx, releasedRow.Fence()); err != nil {
			t.Fatal(err)
		}
		inflight := mustClaim(t, s, newClaim(time.Hour))
		indet := mustClaim(t, s, newClaim(time.Hour))
		if err := s.MarkIndeterminate(ctx, indet.Fence(), ledger.ErrorInfo{Code: "x"}); err != nil {
			t.Fatal(err)
		}
		// Age everything past the retention, then add one fresh finished row.
		const retention = 2 * time.Second
		deadline := time.Now().Add(retention + 200*time.Millisecond)
		for time.Now().Before(deadline) {
			time.Sleep(time.Until(deadline))
		}
		fresh := mustClaim(t, s, newClaim(time.Hour))
		if err := s.Complete(ctx, fresh.Fence(), json.RawMessage(`{}`)); err != nil {
			t.Fatal(err)
		}
		n, err := s.Purge(ctx, retention, 10)
		if err != nil || n != 26 {
			t.Fatalf("purged %d rows (%v), want 25 finished and 1 released", n, err)
		}
		for _, k := range old {
			if _, err := s.Get(ctx, k); !errors.Is(err, ledger.ErrNotFound) {
				t.Fatalf("old row %s survived: %v", k, err)
			}
		}
		for _, k := range []string{inflight.Key, indet.Key, fresh.Key} {
			mustGet(t, s, k)
		}
	})
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			url := ""
			if backend == "postgres" {
				url = testenv.Postgres(t)
			}
			dir := t.TempDir()
			var wg sync.WaitGroup
			errs := make(chan error, 6)
			for range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, err := ledger.Open(ctx, url, dir)
					if err != nil {
						errs <- err
						return
					}
					defer s.Close()
					errs <- s.Migrate(ctx)
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			s, err := ledger.Open(ctx, url, dir)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.Backend() != backend {
				t.Fatalf("Open chose %s", s.Backend())
			}
			mustClaim(t, s, newClaim(time.Minute))
		})
	}
}

// TestPurgeIsRecorded: every purge leaves its cutoff, and the record keeps
// the latest one, so that a purge with a longer retention after one with a
// shorter does not hide what the shorter deleted.
func TestPurgeIsRecorded(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		if r, err := s.LastPurge(ctx); err != nil || !r.PurgedBefore.IsZero() {
			t.Fatalf("record of a ledger never purged: %+v %v", r, err)
		}
		row := mustClaim(t, s, newClaim(time.Hour))
		if err := s.Complete(ctx, row.Fence(), json.RawMessage(`{}`)); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "the row to age past 10ms", func() bool {
			n, err := s.PurgeCount(ctx, 10*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			return n == 1
		})
		if r, err := s.LastPurge(ctx); err != nil || !r.PurgedBefore.IsZero() {
			t.Fatalf("a count was recorded as a purge: %+v %v", r, err)
		}
		before := time.Now()
		if n, err := s.Purge(ctx, 10*time.Millisecond, 0); err != nil || n != 1 {
			t.Fatalf("purge: %d %v", n, err)
		}
		first, err := s.LastPurge(ctx)
		if err != nil || first.OlderThan != 10*time.Millisecond || first.PurgedBefore.Before(before.Add(-time.Second)) ||
			first.PurgedBefore.After(time.Now()) || first.At.Sub(first.PurgedBefore) != 10*time.Millisecond {
			t.Fatalf("after the first purge: %+v %v", first, err)
		}
		if _, err := s.Purge(ctx, 30*24*time.Hour, 0); err != nil {
			t.Fatal(err)
		}
		second, err := s.LastPurge(ctx)
		if err != nil || second.OlderThan != 30*24*time.Hour || !second.PurgedBefore.Equal(first.PurgedBefore) || second.At.Before(first.At) {
			t.Fatalf("after a purge with a longer retention: %+v %v (first %+v)", second, err, first)
		}
	})
}

// TestFailuresAndClaimTokens: a row keeps the count of failed tries the
// worker records, across a release and the claim after it; a claim's token
// is on its row until a takeover replaces it with its own; a stale fence
// cannot count.
func TestFailuresAndClaimTokens(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c := newClaim(time.Minute)
		c.Token = "token-1"
		row := mustClaim(t, s, c)
		if row.ClaimToken != "token-1" || row.Failures != 0 {
			t.Fatalf("new claim: %+v", row)
		}
		if err := s.CountFailures(ctx, row.Fence(), 1); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, row.Fence()); err != nil {
			t.Fatal(err)
		}
		isErr(t, s.CountFailures(ctx, row.Fence(), 5), ledger.ErrNotFound)
		c.Token = "token-2"
		again := mustClaim(t, s, c)
		if again.Failures != 1 || again.ClaimToken != "token-2" || again.Attempt != 2 {
			t.Fatalf("claim after a failed try: %+v", again)
		}
		if err := s.CountFailures(ctx, again.Fence(), 2); err != nil {
			t.Fatal(err)
		}
		if err := s.EndLease(ctx, again.Fence(), ledger.ErrorInfo{Code: "timeout"}); err != nil {
			t.Fatal(err)
		}
		taken, err := s.Takeover(ctx, again.Fence(), "next", "token-3", time.Minute)
		if err != nil || taken.Failures != 2 || taken.ClaimToken != "token-3" || taken.Attempt != 3 {
			t.Fatalf("takeover: %+v %v", taken, err)
		}
		isErr(t, s.CountFailures(ctx, again.Fence(), 9), ledger.ErrFenced)
		if _, err := s.Takeover(ctx, taken.Fence(), "next", "", time.Minute); err == nil || !strings.Contains(err.Error(), "token is required") {
			t.Fatalf("a takeover without a token: %v", err)
		}
	})
}

// TestFenceNamesTheClaim: a fence is the claim's attempt and its token. A
// write with the row's attempt under another token (the holder of a claim
// the database lost in a crash, which was then claimed again at the same
// attempt) changes nothing and says so; so does a takeover of it.
func TestFenceNamesTheClaim(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c := newClaim(time.Millisecond)
		c.Token = newToken()
		row := mustClaim(t, s, c)
		zombie := row.Fence()
		zombie.Token = newToken()
		writes := map[string]func(ledger.Fence) error{
			"extend":             func(f ledger.Fence) error { return s.Extend(ctx, f, time.Minute) },
			"count failures":     func(f ledger.Fence) error { return s.CountFailures(ctx, f, 3) },
			"complete":           func(f ledger.Fence) error { return s.Complete(ctx, f, json.RawMessage(`{"zombie":true}`)) },
			"fail":               func(f ledger.Fence) error { return s.Fail(ctx, f, ledger.ErrorInfo{Code: "zombie"}) },
			"end lease":          func(f ledger.Fence) error { return s.EndLease(ctx, f, ledger.ErrorInfo{Code: "zombie"}) },
			"mark indeterminate": func(f ledger.Fence) error { return s.MarkIndeterminate(ctx, f, ledger.ErrorInfo{Code: "zombie"}) },
			"release":            func(f ledger.Fence) error { return s.Release(ctx, f) },
			"complete batch": func(f ledger.Fence) error {
				errs, err := s.CompleteBatch(ctx, []ledger.Completion{{Fence: f, Output: json.RawMessage(`{"zombie":true}`)}})
				return errors.Join(err, errs[0])
			},
			"takeover": func(f ledger.Fence) error {
				_, err := s.Takeover(ctx, f, "zombie", newToken(), time.Minute)
				return err
			},
		}
		time.Sleep(5 * time.Millisecond) // the lease ran out: only the token stops the takeover
		for op, write := range writes {
			err := write(zombie)
			isErr(t, err, ledger.ErrFenced)
			if !strings.Contains(err.Error(), "under another claim") {
				t.Errorf("%s: %v does not say why", op, err)
			}
		}
		got, err := s.Get(ctx, row.Key)
		if err != nil || got.State != ledger.InFlight || got.Attempt != 1 || got.ClaimToken != c.Token || got.Failures != 0 || got.Error != nil {
			t.Fatalf("the zombie's writes changed the row: %+v %v", got, err)
		}
		if err := s.Complete(ctx, row.Fence(), json.RawMessage(`{"ok":true}`)); err != nil {
			t.Fatalf("the holder's own fence: %v", err)
		}
	})
}

// newToken is a claim token unique to its call, as the worker makes them.
func newToken() string { return rand.Text() }

// TestOutputsWithNULAreKeptOnBothBackends: JSON may escape U+0000 as
// \u0000, which Postgres's jsonb refuses and its text keeps. An output or
// an error message holding one is stored and read back byte for byte by
// Complete, CompleteBatch, Fail and Resolve on both backends, and a
// resolution records it in the row's history: a completed call's output
// never makes its completion, or an operator's decision, fail.
func TestOutputsWithNULAreKeptOnBothBackends(t *testing.T) {
	t.Parallel()
	const output = `{"a":"\u0000","b":["x\u0000y"]}`
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		completed := mustClaim(t, s, newClaim(time.Minute))
		if err := s.Complete(ctx, completed.Fence(), json.RawMessage(output)); err != nil {
			t.Fatalf("complete: %v", err)
		}
		batched := mustClaim(t, s, newClaim(time.Minute))
		if errs, err := s.CompleteBatch(ctx, []ledger.Completion{{Fence: batched.Fence(), Output: json.RawMessage(output)}}); err != nil || errs[0] != nil {
			t.Fatalf("complete batch: %v %v", errs, err)
		}
		for _, key := range []string{completed.Key, batched.Key} {
			if row := mustGet(t, s, key); row.State != ledger.Completed || string(row.Result) != output {
				t.Fatalf("read back %s %s", row.State, row.Result)
			}
		}

		failed := mustClaim(t, s, newClaim(time.Minute))
		if err := s.Fail(ctx, failed.Fence(), ledger.ErrorInfo{Code: "declined", Message: "nul\x00inside"}); err != nil {
			t.Fatalf("fail: %v", err)
		}
		if row := mustGet(t, s, failed.Key); row.Error == nil || row.Error.Message != "nul\x00inside" {
			t.Fatalf("error read back as %+v", row.Error)
		}

		// An indeterminate row whose error holds U+0000, resolved with an
		// output that holds it too, and one resolved as not run.
		indeterminate := func() ledger.Claim {
			c := newClaim(time.Minute)
			row := mustClaim(t, s, c)
			if err := s.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset", Message: "reset\x00"}); err != nil {
				t.Fatal(err)
			}
			return c
		}
		done, notRun := indeterminate(), indeterminate()
		res := ledger.Resolution{Output: json.RawMessage(output), By: "op", Reason: "found it"}
		if changed, err := s.Resolve(ctx, done.Key, res); !changed || err != nil {
			t.Fatalf("resolve with an output holding U+0000: %v %v", changed, err)
		}
		row := mustGet(t, s, done.Key)
		ev := row.LastResolution()
		if row.State != ledger.Completed || string(row.Result) != output || ev == nil || string(ev.Output) != output ||
			ev.Error == nil || ev.Error.Message != "reset\x00" {
			t.Fatalf("resolved row %s %s, history %+v", row.State, row.Result, row.History)
		}
		if changed, err := s.Resolve(ctx, done.Key, res); changed || err != nil {
			t.Fatalf("the same resolution again: %v %v", changed, err)
		}
		if changed, err := s.Resolve(ctx, notRun.Key, ledger.Resolution{NotRun: true, By: "op", Reason: "not there"}); !changed || err != nil {
			t.Fatalf("resolve not run an error holding U+0000: %v %v", changed, err)
		}
		again := mustClaim(t, s, notRun)
		if h := again.History; len(h) != 1 || h[0].Error == nil || h[0].Error.Message != "reset\x00" {
			t.Fatalf("history after the claim %+v", h)
		}
	})
}

// TestPurgeMeasuresFromTheLastAnswer: a row that answered a duplicate is
// kept for the retention counted from that answer, not from when it
// settled: the duplicate's job stays in TOOLQ_JOBS (replayable) and may be
// dead-lettered and requeued for as long after it as the retention allows,
// and without the row it would run its call again. A duplicate answered
// within answeredEvery (shortened here to a second) of its row's settling
// writes nothing: the settling stands for it.
func TestPurgeMeasuresFromTheLastAnswer(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		const every = time.Second
		s.SetAnsweredEvery(every)
		ctx := context.Background()
		settled := func(fail bool) ledger.Claim {
			c := newClaim(time.Hour)
			row := mustClaim(t, s, c)
			var err error
			if fail {
				err = s.Fail(ctx, row.Fence(), ledger.ErrorInfo{Code: "no"})
			} else {
				err = s.Complete(ctx, row.Fence(), json.RawMessage(`{}`))
			}
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		answered, answeredFailed, quiet, early := settled(false), settled(true), settled(false), settled(false)
		// The retried turn's duplicate, at once: answered from the row, and
		// nothing written (on Postgres, the read that answers it first, on
		// the claim statement otherwise, does not record it).
		for range 2 {
			dup := early
			dup.ToolUseID = "toolu_retried_at_once"
			if r := claimOne(t, s, dup); r.Claimed || r.Err != nil || r.Row.State != ledger.Completed {
				t.Fatalf("duplicate at once: %+v", r)
			}
		}
		if row := mustGet(t, s, early.Key); !row.AnsweredAt.IsZero() && row.AnsweredAt.Sub(row.UpdatedAt) < every {
			t.Fatalf("a duplicate answered within %v of its row's settling recorded its answer: answered_at %v, updated_at %v", every, row.AnsweredAt, row.UpdatedAt)
		}
		const retention = 2 * time.Second
		testenv.Eventually(t, 10*time.Second, "the rows to age past the retention", func() bool {
			n, err := s.PurgeCount(ctx, retention)
			if err != nil {
				t.Fatal(err)
			}
			return n >= 4
		})
		// Duplicates of two of them are answered from their rows now; the
		// time is written once, not at every duplicate.
		before := time.Now().Add(-time.Second)
		first := map[string]time.Time{}
		for range 2 {
			for _, c := range []ledger.Claim{answered, answeredFailed} {
				dup := c
				dup.ToolUseID = "toolu_retried"
				if r := claimOne(t, s, dup); r.Claimed || r.Err != nil || (r.Row.State != ledger.Completed && r.Row.State != ledger.Failed) {
					t.Fatalf("duplicate: %+v", r)
				}
				at := mustGet(t, s, c.Key).AnsweredAt
				if at.Before(before) || (!first[c.Key].IsZero() && !at.Equal(first[c.Key])) {
					t.Fatalf("answered at %v, first %v, before %v", at, first[c.Key], before)
				}
				first[c.Key] = at
			}
		}
		if at := mustGet(t, s, quiet.Key).AnsweredAt; !at.IsZero() {
			t.Fatalf("a row that answered nothing has answered_at %v", at)
		}
		// An answer outside a claim (behind an open breaker) counts too.
		outside := settled(false)
		testenv.Eventually(t, 10*time.Second, "the row to age past the retention", func() bool {
			return mustGet(t, s, outside.Key).UpdatedAt.Before(time.Now().Add(-retention))
		})
		for range 2 {
			if err := s.Answered(ctx, outside.Key); err != nil {
				t.Fatal(err)
			}
		}
		if at := mustGet(t, s, outside.Key).AnsweredAt; at.Before(before) {
			t.Fatalf("answered outside a claim: answered_at %v", at)
		}
		inFlight := newClaim(time.Hour)
		mustClaim(t, s, inFlight)
		if r := claimOne(t, s, inFlight); r.Claimed || !mustGet(t, s, inFlight.Key).AnsweredAt.IsZero() {
			t.Fatalf("a claim that found the row in flight answered from it: %+v", r)
		}
		if n, err := s.Purge(ctx, retention, 0); err != nil || n != 2 {
			t.Fatalf("purged %d rows (%v), want the one that answered nothing and the one that answered at once", n, err)
		}
		for _, c := range []ledger.Claim{quiet, early} {
			if _, err := s.Get(ctx, c.Key); !errors.Is(err, ledger.ErrNotFound) {
				t.Fatalf("a row whose last answer is older than the retention survived: %v", err)
			}
		}
		for _, c := range []ledger.Claim{answered, answeredFailed} {
			mustGet(t, s, c.Key)
		}
	})
}
