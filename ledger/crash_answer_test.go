package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// TestAnAnsweredDuplicateSurvivesACrash: a duplicate of a keyed or
// transactional write (whose claims ask for AsyncCommit) comes back to a
// row that settled long ago (a replay), and is answered from it; the
// answer is what the retention counts from. Postgres then crashes (every
// process killed, no checkpoint) before the WAL writer's next flush. The
// row must still say it answered, or a purge within the retention after
// that answer deletes it and the duplicate's job, replayed, runs again.
func TestAnAnsweredDuplicateSurvivesACrash(t *testing.T) {
	t.Parallel()
	cluster := testenv.OwnCluster(t, "synchronous_commit=on", "wal_writer_delay=10s")
	ctx := context.Background()
	s, err := ledger.Open(ctx, cluster.Database(t), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s.SetAnsweredEvery(100 * time.Millisecond)
	c := newClaim(time.Minute)
	c.Token, c.AsyncCommit = newToken(), true
	row := mustClaim(t, s, c)
	if err := s.Complete(ctx, row.Fence(), json.RawMessage(`{"paid":true}`)); err != nil {
		t.Fatal(err)
	}
	const retention = 5 * time.Second
	time.Sleep(retention + 200*time.Millisecond)
	dup := c
	dup.ToolUseID, dup.Token = "toolu_replayed", newToken()
	if r := claimOne(t, s, dup); r.Claimed || r.Row.State != ledger.Completed {
		t.Fatalf("the duplicate: %+v", r)
	}
	answered := time.Now()
	if at := mustGet(t, s, c.Key).AnsweredAt; at.IsZero() {
		t.Fatal("the answer was not recorded")
	}
	crashThenPurge(t, cluster, s, dup, answered, retention)
}

// crashThenPurge crashes and restarts Postgres right after a duplicate of
// dup's call was answered (at answered), then purges with the retention:
// the row must survive while the duplicate's job can come back, or its
// job, replayed, would run the call again.
func crashThenPurge(t *testing.T, cluster *testenv.Cluster, s *ledger.Store, dup ledger.Claim, answered time.Time, retention time.Duration) {
	t.Helper()
	ctx := context.Background()
	if err := cluster.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	var got ledger.Row
	var err error
	testenv.Eventually(t, 20*time.Second, "the ledger back after the crash", func() bool {
		got, err = s.Get(ctx, dup.Key)
		return !errors.Is(err, ledger.ErrUnavailable)
	})
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.Purge(ctx, retention, 0)
	if err != nil {
		t.Fatal(err)
	}
	if since := time.Since(answered); n > 0 && since < retention {
		again := dup
		again.ToolUseID, again.Token = dup.ToolUseID+"_again", newToken()
		r := claimOne(t, s, again)
		t.Fatalf("the crash lost the answer (answered_at now %v) and a purge %v after it, within the retention of %v, deleted the row: the duplicate's job replayed is claimed to run again (claimed=%v)",
			got.AnsweredAt, since.Round(time.Millisecond), retention, r.Claimed)
	}
}
