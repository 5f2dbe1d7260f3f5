package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
)

var claimSeq atomic.Int64

func testClaim() Claim {
	n := claimSeq.Add(1)
	return Claim{Key: fmt.Sprintf("cr-%d-%d", time.Now().UnixNano(), n), ConversationID: "c", TurnIndex: n, Tool: "t",
		ArgsDigest: "d", ToolUseID: fmt.Sprintf("toolu_%d", n), Owner: "o", Lease: time.Minute}
}

func openTestStore(t *testing.T, extra string) (*Store, *postgresDB) {
	t.Helper()
	ctx := context.Background()
	url := testenv.Postgres(t)
	sep := "?"
	for _, c := range url {
		if c == '?' {
			sep = "&"
		}
	}
	// Its sessions wait for the disk, as a production server's do (the
	// test cluster's default is off): a claim's setting that leaked shows.
	if extra != "" {
		extra = "&" + extra
	}
	s, err := OpenPostgres(ctx, url+sep+"synchronous_commit=on"+extra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s, s.db.(*postgresDB)
}

// planCacheMode is the connection's plan_cache_mode, and its
// synchronous_commit after a comma: "auto,on" unless a claim's settings
// leaked (openTestStore's connections start with synchronous_commit on).
func planCacheMode(t *testing.T, p *postgresDB) string {
	t.Helper()
	var mode string
	if err := p.pool.QueryRow(context.Background(), `SELECT current_setting('plan_cache_mode') || ',' || current_setting('synchronous_commit')`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	return mode
}

// asyncClaim is a testClaim that commits asynchronously.
func asyncClaim() Claim {
	c := testClaim()
	c.AsyncCommit, c.Token = true, c.Key+"-token"
	return c
}

// TestSetConfigDoesNotLeak: after claims that succeed (waiting for the disk
// or not), fail on the server, or are cancelled, the pool's one connection
// has the default plan_cache_mode and synchronous_commit.
func TestSetConfigDoesNotLeak(t *testing.T) {
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			s, p := openTestStore(t, "pool_max_conns=1&default_query_exec_mode="+mode)
			ctx := context.Background()
			for _, c := range []Claim{testClaim(), asyncClaim(), testClaim(), asyncClaim()} {
				if _, err := s.Claim(ctx, []Claim{c}); err != nil {
					t.Fatal(err)
				}
				if m := planCacheMode(t, p); m != "auto,on" {
					t.Fatalf("after a claim (async %v): plan_cache_mode,synchronous_commit %q", c.AsyncCommit, m)
				}
			}
			bad := asyncClaim()
			if mode == "simple_protocol" { // the simple protocol refuses the NUL as a malformed message (08P01)
				bad.Lease = -time.Second
				bad.Key = ""
			}
			bad.ConversationID = "a\x00b" // 22021 on the server, mid-pipeline
			_, err := s.Claim(ctx, []Claim{bad})
			t.Logf("bad claim: %v", err)
			if err == nil {
				t.Fatal("a claim with a NUL byte succeeded")
			}
			if errors.Is(err, ErrUnavailable) {
				t.Fatalf("a data error is unavailable: %v", err)
			}
			if m := planCacheMode(t, p); m != "auto,on" {
				t.Fatalf("after a failed claim: plan_cache_mode %q", m)
			}
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			_, err = s.Claim(cctx, []Claim{testClaim()})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled claim: %v", err)
			}
			if m := planCacheMode(t, p); m != "auto,on" {
				t.Fatalf("after a cancelled claim: plan_cache_mode %q", m)
			}
		})
	}
}

// TestTerminatedConnection: a claim on a pooled connection the
// server terminated is ErrUnavailable.
func TestTerminatedConnection(t *testing.T) {
	s, p := openTestStore(t, "pool_max_conns=1")
	ctx := context.Background()
	if _, err := s.Claim(ctx, []Claim{testClaim()}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		var pid int32
		if err := p.pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		other, _ := openTestStore(t, "")
		if _, err := other.db.(*postgresDB).pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		_, err := s.Claim(ctx, []Claim{testClaim()})
		t.Logf("claim %d on a terminated connection: %v", i, err)
		if err != nil && !errors.Is(err, ErrUnavailable) {
			t.Fatalf("claim on a terminated connection: %v, want ErrUnavailable", err)
		}
	}
}

// TestDeadlineMidStatement: a claim blocked on a row lock until its
// deadline is ErrUnavailable (DeadlineExceeded), and leaves no setting.
func TestDeadlineMidStatement(t *testing.T) {
	s, p := openTestStore(t, "pool_max_conns=2")
	ctx := context.Background()
	c := testClaim()
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO toolq_ledger (key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner, lease_until, first_tool_use_id)
		VALUES ($1, 'c', 1, 't', 0, 'd', 'in_flight', 1, 'x', now(), 'u')`, c.Key); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = s.Claim(cctx, []Claim{c})
	t.Logf("blocked claim: %v", err)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked claim: %v", err)
	}
	tx.Rollback(ctx)
	for range 4 {
		if m := planCacheMode(t, p); m != "auto,on" {
			t.Fatalf("plan_cache_mode %q", m)
		}
	}
}

// TestDeadlockMidPipelineIsRetried: a claim that Postgres aborts as
// deadlocked (40P01, raised inside the pipeline) is run again by
// retryConflicts and then succeeds.
func TestDeadlockMidPipelineIsRetried(t *testing.T) {
	s, p := openTestStore(t, "")
	ctx := context.Background()
	a, b := testClaim(), testClaim()
	a.Key, b.Key = "cr-deadlock-a", "cr-deadlock-b"
	insert := `INSERT INTO toolq_ledger (key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner, lease_until, first_tool_use_id)
		VALUES ($1, 'c', 1, 't', 0, 'd', 'released', 1, 'x', now(), 'u')`
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, insert, b.Key); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res []ClaimResult
		err error
	}
	claimed := make(chan answer, 1)
	go func() { res, err := s.Claim(ctx, []Claim{a, b}); claimed <- answer{res, err} }()
	time.Sleep(200 * time.Millisecond) // the claim holds a and waits for b
	txErr := make(chan error, 1)
	go func() { _, err := tx.Exec(ctx, insert, a.Key); txErr <- err }()
	select {
	case err := <-txErr:
		t.Logf("the other transaction's insert of a: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no deadlock was detected")
	}
	tx.Rollback(ctx)
	got := <-claimed
	t.Logf("claim: %v %+v", got.err, got.res)
	if got.err != nil || !got.res[0].Claimed || !got.res[1].Claimed {
		t.Fatalf("claim after a deadlock: %v %+v", got.err, got.res)
	}
	if m := planCacheMode(t, p); m != "auto,on" {
		t.Fatalf("plan_cache_mode %q", m)
	}
}

// TestClaimWithoutGenericPlan: on a server that does not know the setting
// genericPlan sets (Postgres before 12), the claim still answers, from the
// first round: the refusal aborts the pipeline before the claim has run, and
// the claim goes alone from then on.
func TestClaimWithoutGenericPlan(t *testing.T) {
	s, p := openTestStore(t, "")
	p.genericPlan = `SELECT set_config('no_such_setting', 'x', true)`
	ctx := context.Background()
	first, second := testClaim(), testClaim()
	for i, c := range []Claim{first, second, first} {
		res, err := s.Claim(ctx, []Claim{c})
		if err != nil {
			t.Fatalf("claim %d on a server without the setting: %v", i, err)
		}
		if want := i < 2; res[0].Claimed != want {
			t.Fatalf("claim %d: claimed %v, want %v", i, res[0].Claimed, want)
		}
		if !p.noGenericPlan.Load() {
			t.Fatalf("claim %d: the refusal was not remembered", i)
		}
	}
	var n int
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM toolq_ledger WHERE key = ANY($1)`, []string{first.Key, second.Key}).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d ledger rows for two keys", n)
	}
}

// TestClaimWithoutAsyncCommit: on a server that refuses the asynchronous
// commit's setting, and then also the generic plan's, an asynchronous claim
// still answers from the first round, each refusal is remembered on its
// own, and the claim goes on with what the server takes.
func TestClaimWithoutAsyncCommit(t *testing.T) {
	s, p := openTestStore(t, "")
	p.asyncCommit = `SELECT set_config('no_such_setting', 'x', true)`
	ctx := context.Background()
	first, second := asyncClaim(), asyncClaim()
	for i, c := range []Claim{first, second, first} {
		res, err := s.Claim(ctx, []Claim{c})
		if err != nil {
			t.Fatalf("claim %d on a server without the setting: %v", i, err)
		}
		if want := i < 2; res[0].Claimed != want {
			t.Fatalf("claim %d: claimed %v, want %v", i, res[0].Claimed, want)
		}
		if !p.noAsyncCommit.Load() || p.noGenericPlan.Load() {
			t.Fatalf("claim %d: refusals remembered: async commit %v, generic plan %v (want true, false)", i, p.noAsyncCommit.Load(), p.noGenericPlan.Load())
		}
	}
	p.genericPlan = `SELECT set_config('no_such_setting', 'y', true)`
	third := asyncClaim()
	if res, err := s.Claim(ctx, []Claim{third}); err != nil || !res[0].Claimed {
		t.Fatalf("a claim with both settings refused: %v %+v", err, res)
	}
	if !p.noGenericPlan.Load() {
		t.Fatal("the generic plan's refusal was not remembered")
	}
	var n int
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM toolq_ledger WHERE key = ANY($1)`, []string{first.Key, second.Key, third.Key}).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("%d ledger rows for three keys", n)
	}
}
