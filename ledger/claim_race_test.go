package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// TestConcurrentClaimsNeverShareAnAttempt: goroutines claim overlapping batches (keys
// repeated, shuffled) of a few keys, and each claim they win they release,
// end, complete, or abandon to expire and be taken over. Every (key,
// attempt) is handed out at most once (by a claim or a takeover), no claim
// errs, an answer that did not claim never names an attempt not yet
// issued, and a key completed before a claim began is answered with its
// completed attempt, never claimed again: with claims that read settled
// rows first (postgres-read-first) and with claims that do not.
func TestConcurrentClaimsNeverShareAnAttempt(t *testing.T) {
	for _, backend := range []string{"postgres", "postgres-read-first"} {
		t.Run(backend, func(t *testing.T) { concurrentClaims(t, openStore(t, backend)) })
	}
}

func concurrentClaims(t *testing.T, s *ledger.Store) {
	ctx := context.Background()
	const workers, iters, nkeys = 6, 120, 6 // the last half may be completed
	keys := make([]ledger.Claim, nkeys)
	for i := range keys {
		keys[i] = newClaim(time.Minute)
	}
	var mu sync.Mutex
	issued := map[ledger.Fence]string{}
	maxAttempt := map[string]int64{}
	completed := map[string]int64{} // key → the attempt that completed it
	var failures []string
	fail := func(f string, a ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(f, a...))
		mu.Unlock()
	}
	issue := func(who string, r ledger.Row) {
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := issued[r.Fence()]; ok {
			failures = append(failures, fmt.Sprintf("%s got %v, already handed to %s", who, r.Fence(), prev))
		}
		issued[r.Fence()] = who
		maxAttempt[r.Key] = max(maxAttempt[r.Key], r.Attempt)
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for i := range iters {
				who := fmt.Sprintf("w%d/%d", w, i)
				var batch []ledger.Claim
				for range 1 + rng.IntN(4) {
					c := keys[rng.IntN(nkeys)]
					c.Owner, c.Token, c.ToolUseID = who, fmt.Sprintf("%s-%d", who, rng.Int()), "toolu_"+who[1:2]
					c.Lease = time.Duration(20+rng.IntN(80)) * time.Millisecond
					batch = append(batch, c)
				}
				mu.Lock()
				done := maps.Clone(completed)
				mu.Unlock()
				res, err := s.Claim(ctx, batch)
				if err != nil {
					fail("%s: claim: %v", who, err)
					return
				}
				for j, r := range res {
					if attempt, ok := done[batch[j].Key]; ok && (r.Claimed || r.Row.State != ledger.Completed || r.Row.Attempt != attempt) {
						fail("%s: %s completed at attempt %d before the claim, answered claimed=%v %s attempt %d", who, batch[j].Key, attempt, r.Claimed, r.Row.State, r.Row.Attempt)
					}
				}
				for j, r := range res {
					if r.Err != nil {
						fail("%s: %v", who, r.Err)
						continue
					}
					if r.Row.Key != batch[j].Key {
						fail("%s: answer for %s names %s", who, batch[j].Key, r.Row.Key)
					}
					row := r.Row
					if !r.Claimed {
						if row.LeaseExpired() {
							if taken, err := s.Takeover(ctx, row.Fence(), who, newToken(), time.Duration(20+rng.IntN(80))*time.Millisecond); err == nil {
								issue(who+" takeover", taken)
								row = taken
							} else {
								continue
							}
						} else {
							continue
						}
					} else {
						if row.State != ledger.InFlight || row.Owner != who || row.ClaimToken != batch[j].Token {
							fail("%s: claimed row %+v is not ours", who, row)
						}
						issue(who, row)
					}
					action := rng.IntN(5)
					if row.Key < keys[nkeys/2].Key && action == 2 { // a key of the first half is never completed
						action = 0
					}
					switch action {
					case 2:
						if err := s.Complete(ctx, row.Fence(), []byte(`{"ok":true}`)); err == nil {
							mu.Lock()
							completed[row.Key] = row.Attempt
							mu.Unlock()
						} else if !isFencedErr(err) {
							fail("%s: complete: %v", who, err)
						}
					case 0:
						if err := s.Release(ctx, row.Fence()); err != nil && !isFencedErr(err) {
							fail("%s: release: %v", who, err)
						}
					case 1:
						s.EndLease(ctx, row.Fence(), ledger.ErrorInfo{Code: "x"})
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	t.Logf("%d fences issued", len(issued))
}

func isFencedErr(err error) bool {
	return err != nil && (errorsIs(err, ledger.ErrFenced) || errorsIs(err, ledger.ErrNotFound))
}

// TestClaimDuringAReleaseAnswersFromItsSnapshot: a duplicate's claim that
// runs while the holder's release is still uncommitted does not wait for
// it: the claim reads the rows that exist first (so that a batch of
// duplicates writes nothing), and answers with the in-flight row it saw.
// The delivery then waits on that attempt and is handed back; the next
// claim, after the release committed, takes the key at the next attempt.
// Either way no attempt is handed out twice.
func TestClaimDuringAReleaseAnswersFromItsSnapshot(t *testing.T) {
	url := testenv.Postgres(t)
	ctx := context.Background()
	s, err := ledger.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	raw, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := newClaim(time.Minute)
	first := mustClaim(t, s, c)
	tx, err := raw.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The holder's Release, not yet committed.
	if _, err := tx.ExecContext(ctx, `UPDATE toolq_ledger SET state = 'released', result = '', error = '', lease_until = now(), updated_at = now()
		WHERE key = $1 AND attempt = $2 AND state = 'in_flight'`, c.Key, first.Attempt); err != nil {
		t.Fatal(err)
	}
	dup := c
	dup.ToolUseID, dup.Owner, dup.Token = "toolu_dup", "dup", "dup-token"
	done := make(chan ledger.ClaimResult, 1)
	go func() {
		res, err := s.Claim(ctx, []ledger.Claim{dup})
		if err != nil {
			t.Error(err)
			done <- ledger.ClaimResult{}
			return
		}
		done <- res[0]
	}()
	time.Sleep(300 * time.Millisecond)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	t.Logf("claim during the release: claimed=%v state=%s attempt=%d owner=%s lease_remaining=%s", r.Claimed, r.Row.State, r.Row.Attempt, r.Row.Owner, r.Row.LeaseRemaining)
	// Before the commit (the snapshot's answer) or after it (waiting on
	// the row): one of the two, never the released attempt claimed again.
	switch {
	case !r.Claimed && r.Row.State == ledger.InFlight && r.Row.Attempt == first.Attempt:
	case r.Claimed && r.Row.Attempt == first.Attempt+1:
	default:
		t.Fatalf("claim during the release: claimed=%v %s attempt %d", r.Claimed, r.Row.State, r.Row.Attempt)
	}
	if !r.Claimed {
		again, err := s.Claim(ctx, []ledger.Claim{dup})
		if err != nil || !again[0].Claimed || again[0].Row.Attempt != first.Attempt+1 {
			t.Fatalf("the claim after the release: %+v %v, want attempt %d claimed", again, err, first.Attempt+1)
		}
	}
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
