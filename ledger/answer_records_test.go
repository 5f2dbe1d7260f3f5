package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// xminOf is the transaction that last wrote key's row.
func xminOf(t *testing.T, conn *pgx.Conn, key string) string {
	t.Helper()
	var x string
	if err := conn.QueryRow(context.Background(), `SELECT xmin::text FROM toolq_ledger WHERE key = $1`, key).Scan(&x); err != nil {
		t.Fatal(err)
	}
	return x
}

// TestAnAsyncDuplicateThatRecordsNothingWritesNothing: a duplicate whose
// row answered within answeredEvery records nothing, so it has nothing to
// flush; the flush is a synchronous write of the row (a WAL record, a
// commit waiting for the disk), which must not be paid on such duplicates.
func TestAnAsyncDuplicateThatRecordsNothingWritesNothing(t *testing.T) {
	t.Parallel()
	s, _, watcher := openStoreAndConns(t)
	const every = 4 * time.Second
	s.SetAnsweredEvery(every)
	c := newClaim(time.Hour)
	if err := completePaid(s, fenceOf(t, s, c)); err != nil {
		t.Fatal(err)
	}
	// Past half the period, within the period: the answer is not due.
	time.Sleep(every*1/2 + 500*time.Millisecond)
	before := xminOf(t, watcher, c.Key)
	dup := c
	dup.ToolUseID, dup.Token, dup.AsyncCommit = "toolu_retried", "tok-retried", true
	r := claimOne(t, s, dup)
	if r.Claimed || r.Err != nil || r.Row.State != ledger.Completed {
		t.Fatalf("duplicate: %+v", r)
	}
	row := mustGet(t, s, c.Key)
	if !row.AnsweredAt.IsZero() {
		t.Fatalf("the answer was recorded (%v) though not due", row.AnsweredAt)
	}
	if after := xminOf(t, watcher, c.Key); after != before {
		t.Fatalf("a duplicate that recorded nothing wrote its row (xmin %s -> %s): a synchronous flush on a claim with nothing to flush", before, after)
	}
}

// TestPurgeDeletesEveryAgedRowThoughOneIsAnsweredMeanwhile: a purge deletes
// every row past the retention. A row of its batch that answers a
// duplicate while the batch runs is kept (re-checked), and the rows past
// that batch must still be deleted: the purge must not take the short batch
// for the last one.
func TestPurgeDeletesEveryAgedRowThoughOneIsAnsweredMeanwhile(t *testing.T) {
	t.Parallel()
	s, locker, watcher := openStoreAndConns(t)
	ctx := context.Background()
	const retention = time.Second
	var keys []string
	for range 3 {
		c := newClaim(time.Hour)
		if err := completePaid(s, fenceOf(t, s, c)); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, c.Key)
	}
	testenv.Eventually(t, 10*time.Second, "the rows to age past the retention", func() bool {
		n, err := s.PurgeCount(ctx, retention)
		return err == nil && n == 3
	})
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM toolq_ledger WHERE key = ANY($1) FOR UPDATE`, keys); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := s.Purge(ctx, retention, 2)
		done <- result{n, err}
	}()
	waitLockWaiters(t, watcher, 1)
	// The row the purge's batch waits for: it answers a duplicate now (what
	// a claim's UPDATE of answered_at does), and commits.
	var key string
	if err := watcher.QueryRow(ctx, `SELECT t.key FROM pg_locks l JOIN toolq_ledger t
		ON t.ctid = ('(' || l.page || ',' || l.tuple || ')')::tid
		WHERE l.locktype = 'tuple' AND l.granted AND l.pid <> $1 AND l.pid <> pg_backend_pid()`, locker.PgConn().PID()).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE toolq_ledger SET answered_at = now() WHERE key = $1`, key); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	left, err := s.PurgeCount(ctx, retention)
	if err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("the purge returned after deleting %d rows with %d rows past the retention left (its batch of 2 came back short: one row re-checked and kept)", res.n, left)
	}
}

// TestManyDuplicatesOfAnOldRowUnderPurgesAreAllAnswered: duplicates of a
// settled row, many at once, each time its answer is due, while purges
// with a longer retention than the row's age run: every claim is answered
// (from the row), none errors.
func TestManyDuplicatesOfAnOldRowUnderPurgesAreAllAnswered(t *testing.T) {
	t.Parallel()
	s, _, _ := openStoreAndConns(t)
	ctx := context.Background()
	c := newClaim(time.Hour)
	if err := completePaid(s, fenceOf(t, s, c)); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	claimed := 0
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				dup := c
				dup.ToolUseID = fmt.Sprintf("toolu_%d_%d", g, i)
				dup.Token, dup.AsyncCommit = dup.ToolUseID, g%2 == 0
				res, err := s.Claim(ctx, []ledger.Claim{dup})
				mu.Lock()
				if err != nil {
					errs = append(errs, err.Error())
				} else if res[0].Claimed {
					claimed++
				}
				mu.Unlock()
				time.Sleep(time.Duration(g%5) * 10 * time.Millisecond)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Purge(ctx, time.Hour, 0); err != nil {
				mu.Lock()
				errs = append(errs, "purge: "+err.Error())
				mu.Unlock()
			}
		}
	}()
	time.Sleep(8 * time.Second)
	close(stop)
	wg.Wait()
	if len(errs) > 0 || claimed > 0 {
		t.Fatalf("%d claims errored, %d claimed a settled key again: %s", len(errs), claimed, strings.Join(errs[:min(len(errs), 5)], "; "))
	}
}

// fenceOf claims c and returns its fence.
func fenceOf(t *testing.T, s *ledger.Store, c ledger.Claim) ledger.Fence {
	t.Helper()
	row := mustClaim(t, s, c)
	return row.Fence()
}

// TestADuplicateAnsweredFromAnotherClaimsRecordSurvivesACrash: a replay
// brings two duplicates of an old settled row at once, one of them claimed
// under an asynchronous commit. An answer recorded in a transaction that
// does not wait for the disk is seen by the other duplicate before it is
// on disk: it is answered from it without recording anything, Postgres
// crashes, the record is lost, a purge within the retention after that
// answer deletes the row, and the duplicate's job, replayed, runs the call
// again. Every answer is recorded in a transaction that waits for the
// disk.
func TestADuplicateAnsweredFromAnotherClaimsRecordSurvivesACrash(t *testing.T) {
	t.Parallel()
	cluster := testenv.OwnCluster(t, "synchronous_commit=on", "wal_writer_delay=10s")
	ctx := context.Background()
	url := cluster.Database(t)
	s, err := ledger.Open(ctx, url, "")
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
	l1, watcher := conn(), conn()
	c := newClaim(time.Minute)
	c.Token, c.AsyncCommit = newToken(), true
	if err := completePaid(s, fenceOf(t, s, c)); err != nil {
		t.Fatal(err)
	}
	const retention = 3 * time.Second
	time.Sleep(retention + 200*time.Millisecond)
	lock := func(conn *pgx.Conn) pgx.Tx {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return tx
	}
	// l1 holds the row: the first duplicate's claim (asynchronous) must
	// record its answer, and waits for the row; the second (one that waits
	// for the disk) comes meanwhile and waits too. Whichever records the
	// answer, the other is answered from that record: it must be on disk
	// before anyone sees it.
	tx1 := lock(l1)
	if _, err := tx1.Exec(ctx, `SELECT 1 FROM toolq_ledger WHERE key = $1 FOR UPDATE`, c.Key); err != nil {
		t.Fatal(err)
	}
	first := c
	first.ToolUseID, first.Token = "toolu_replayed_1", newToken()
	firstDone := make(chan ledger.ClaimResult, 1)
	go func() {
		res, err := s.Claim(ctx, []ledger.Claim{first})
		if err != nil {
			firstDone <- ledger.ClaimResult{Err: err}
			return
		}
		firstDone <- res[0]
	}()
	waitLockWaiters(t, watcher, 1)
	second := c
	second.ToolUseID, second.Token, second.AsyncCommit = "toolu_replayed_2", newToken(), false
	secondDone := make(chan ledger.ClaimResult, 1)
	go func() {
		res, err := s.Claim(ctx, []ledger.Claim{second})
		if err != nil {
			secondDone <- ledger.ClaimResult{Err: err}
			return
		}
		secondDone <- res[0]
	}()
	waitLockWaiters(t, watcher, 2)
	if err := tx1.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, done := range []chan ledger.ClaimResult{firstDone, secondDone} {
		if r := <-done; r.Err != nil || r.Claimed || r.Row.State != ledger.Completed {
			t.Fatalf("a duplicate: %+v", r)
		}
	}
	answered := time.Now()
	crashThenPurge(t, cluster, s, second, answered, retention)
}
