package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// TestCrashLosesOnlyAsyncClaims: Postgres crashes (every process killed at
// once, no checkpoint) right after three claims. The claim that waited for
// the disk, and the asynchronous one whose holder completed it, survive; the
// asynchronous claim nobody wrote after is lost: its key is free, the next
// claim takes the same attempt under a new token, and a write of the first
// holder, at that attempt, is fenced out.
func TestCrashLosesOnlyAsyncClaims(t *testing.T) {
	t.Parallel()
	// The WAL writer flushes the asynchronous commits every 10 s: the
	// crash comes long before it does.
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
	claim := func(async bool) ledger.Claim {
		c := newClaim(time.Minute)
		c.Token, c.AsyncCommit = newToken(), async
		return c
	}
	waited, completed, lost := claim(false), claim(true), claim(true)
	// The waiting claim goes first: its flush would carry the others.
	mustClaim(t, s, waited)
	done := mustClaim(t, s, completed)
	if err := s.Complete(ctx, done.Fence(), json.RawMessage(`{"paid":true}`)); err != nil {
		t.Fatal(err)
	}
	lostRow := mustClaim(t, s, lost)
	zombie := lostRow.Fence()
	if err := cluster.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	var row ledger.Row
	testenv.Eventually(t, 20*time.Second, "the ledger back after the crash", func() bool {
		row, err = s.Get(ctx, waited.Key)
		return !errors.Is(err, ledger.ErrUnavailable)
	})
	if err != nil || row.State != ledger.InFlight || row.ClaimToken != waited.Token {
		t.Fatalf("the claim that waited for the disk after the crash: %+v %v", row, err)
	}
	if row = mustGet(t, s, completed.Key); row.State != ledger.Completed || row.ClaimToken != completed.Token {
		t.Fatalf("the asynchronous claim its holder completed: %+v", row)
	}
	if _, err := s.Get(ctx, lost.Key); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("the asynchronous claim nobody wrote after survived the crash (%v): it was not committed asynchronously", err)
	}

	again := lost
	again.Token = newToken()
	second := mustClaim(t, s, again)
	if second.Attempt != zombie.Attempt || second.ClaimToken != again.Token {
		t.Fatalf("the claim after the lost one: %+v", second)
	}
	err = s.Complete(ctx, zombie, json.RawMessage(`{"zombie":true}`))
	if !errors.Is(err, ledger.ErrFenced) || !strings.Contains(err.Error(), "under another claim") {
		t.Fatalf("the first holder's write at the same attempt: %v", err)
	}
	if err := s.Complete(ctx, second.Fence(), json.RawMessage(`{"paid":true}`)); err != nil {
		t.Fatal(err)
	}
	if row = mustGet(t, s, lost.Key); row.State != ledger.Completed || string(row.Result) != `{"paid":true}` {
		t.Fatalf("after the second holder completed: %+v", row)
	}
}

// TestAsyncCommitNeedsToken: a claim that may be lost in a crash must carry
// the token that tells its holder from the next one.
func TestAsyncCommitNeedsToken(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		c := newClaim(time.Minute)
		c.AsyncCommit = true
		_, err := s.Claim(context.Background(), []ledger.Claim{c})
		if err == nil || !strings.Contains(err.Error(), "needs a token") {
			t.Fatalf("an asynchronous claim without a token: %v", err)
		}
	})
}
