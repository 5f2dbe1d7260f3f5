package ledger_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// openStoreAndConns opens a Postgres store, a connection that holds a row
// lock for a moment and one that watches the others wait, all on one
// fresh database.
func openStoreAndConns(t *testing.T) (*ledger.Store, *pgx.Conn, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	url := testenv.Postgres(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	s, err := ledger.OpenPostgres(ctx, url+sep+"pool_max_conns=16")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s.SetAnsweredEvery(100 * time.Millisecond)
	conn := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	return s, conn(), conn()
}

// waitLockWaiters waits until n sessions of the database wait for a lock.
func waitLockWaiters(t *testing.T, watcher *pgx.Conn, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "sessions waiting for the row", func() bool {
		var got int
		if err := watcher.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got >= n
	})
}

// interleave holds key's row locked, starts a claim of c and a purge with
// the retention (in that order, or the purge first), waits until both wait
// for the row, and lets them go in that order: what a purge batch and a
// claim of the same row meet without the lock, on a busy ledger, between
// one's write and its commit. It returns the claim's answer and how many
// rows the purge deleted.
func interleave(t *testing.T, s *ledger.Store, locker, watcher *pgx.Conn, key string, c ledger.Claim, retention time.Duration, purgeFirst bool) (ledger.ClaimResult, int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM toolq_ledger WHERE key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	claimed := make(chan ledger.ClaimResult, 1)
	claim := func() {
		res, err := s.Claim(ctx, []ledger.Claim{c})
		if err != nil {
			t.Error(err)
			claimed <- ledger.ClaimResult{Err: err}
			return
		}
		claimed <- res[0]
	}
	purged := make(chan int64, 1)
	purge := func() {
		n, err := s.Purge(ctx, retention, 0)
		if err != nil {
			t.Error(err)
		}
		purged <- n
	}
	first, second := claim, purge
	if purgeFirst {
		first, second = purge, claim
	}
	go first()
	waitLockWaiters(t, watcher, 1)
	go second()
	waitLockWaiters(t, watcher, 2)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	return <-claimed, <-purged
}

// agedRow claims a call, settles it (settle: complete or release), and
// waits until a purge with the retention would take its row.
func agedRow(t *testing.T, s *ledger.Store, retention time.Duration, settle func(*ledger.Store, ledger.Fence) error) ledger.Claim {
	t.Helper()
	c := newClaim(time.Hour)
	row := mustClaim(t, s, c)
	if err := settle(s, row.Fence()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the row to age past the retention", func() bool {
		n, err := s.PurgeCount(context.Background(), retention)
		return err == nil && n == 1
	})
	return c
}

func completePaid(s *ledger.Store, f ledger.Fence) error {
	return s.Complete(context.Background(), f, json.RawMessage(`{"paid":true}`))
}

// TestPurgeKeepsARowThatAnswersADuplicateMeanwhile: a duplicate that comes
// back to a row old enough to purge (a retried turn of an old
// conversation, a replay) is answered from it and its answer recorded; a
// purge running at that moment must not delete the row, or the
// duplicate's own job, replayed or requeued within the retention, runs
// the call again.
func TestPurgeKeepsARowThatAnswersADuplicateMeanwhile(t *testing.T) {
	t.Parallel()
	s, locker, watcher := openStoreAndConns(t)
	const retention = time.Second
	c := agedRow(t, s, retention, completePaid)
	dup := c
	dup.ToolUseID = "toolu_retried_turn"
	r, n := interleave(t, s, locker, watcher, c.Key, dup, retention, false)
	if r.Claimed || r.Err != nil || r.Row.State != ledger.Completed {
		t.Fatalf("the duplicate was not answered from the row: %+v", r)
	}
	if _, err := s.Get(context.Background(), c.Key); err != nil {
		again := dup
		again.ToolUseID = "toolu_its_job_replayed"
		second := claimOne(t, s, again)
		t.Fatalf("the purge (%d rows) deleted the row that had just answered a duplicate: %v; the duplicate's job replayed a moment later is claimed to run again: claimed=%v attempt=%d",
			n, err, second.Claimed, second.Row.Attempt)
	}
}

// TestPurgeNeverDeletesAKeyClaimedMeanwhile: a released row (a call not
// sent) old enough to purge is claimed again by the call's next delivery;
// a purge running at that moment must not delete the in-flight row, or the
// call, run by that claim, runs again at the next delivery.
func TestPurgeNeverDeletesAKeyClaimedMeanwhile(t *testing.T) {
	t.Parallel()
	s, locker, watcher := openStoreAndConns(t)
	const retention = time.Second
	c := agedRow(t, s, retention, func(s *ledger.Store, f ledger.Fence) error { return s.Release(context.Background(), f) })
	next := c
	next.ToolUseID = "toolu_next_delivery"
	r, n := interleave(t, s, locker, watcher, c.Key, next, retention, false)
	if !r.Claimed || r.Err != nil || r.Row.Attempt != 2 {
		t.Fatalf("the next delivery did not claim the released key: %+v", r)
	}
	// The holder runs the call, then completes it.
	cerr := completePaid(s, r.Row.Fence())
	again := c
	again.ToolUseID = "toolu_redelivered"
	if second := claimOne(t, s, again); second.Claimed {
		t.Fatalf("the purge (%d rows) deleted the row of a call claimed and running; its completion got %v, and the call's next delivery claims it to run a second time (attempt %d)",
			n, cerr, second.Row.Attempt)
	}
}

// TestADuplicateIsNotAnsweredFromARowPurgedUnderIt: the other order. A
// purge batch's statement takes the row first and a duplicate's claim,
// whose snapshot still has the row, waits for it; the purge commits. The
// claim must not answer the duplicate from the row it read, which is gone:
// the duplicate's job, replayed within the retention, would run the call
// again. (Its answer is recorded nowhere: the claim's write of answered_at
// found no row.)
func TestADuplicateIsNotAnsweredFromARowPurgedUnderIt(t *testing.T) {
	t.Parallel()
	s, locker, watcher := openStoreAndConns(t)
	const retention = time.Second
	c := agedRow(t, s, retention, completePaid)
	dup := c
	dup.ToolUseID = "toolu_retried_turn"
	r, n := interleave(t, s, locker, watcher, c.Key, dup, retention, true)
	if _, err := s.Get(context.Background(), c.Key); err != nil && !r.Claimed {
		again := dup
		again.ToolUseID = "toolu_its_job_replayed"
		second := claimOne(t, s, again)
		t.Fatalf("the duplicate was answered from a row the purge (%d rows) deleted under it (%+v, now %v): its job replayed is claimed to run again: claimed=%v",
			n, r.Row.State, err, second.Claimed)
	}
}
