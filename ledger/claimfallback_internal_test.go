package ledger

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// refusedSetting is what a server without plan_cache_mode answers the
// claim's set_config with: 42704 at execution.
const refusedSetting = `SELECT set_config('no_such_setting', 'x', true)`

var execModes = []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}

// TestClaimFallbackEveryExecMode: in every pgx exec mode, the refusal
// arrives at the first Exec (so the fallback is taken, not returned as an
// error), the pipelined claim did not run (the fallback's claim is the one
// that inserts), a repeat is answered as existing, and a data error in
// fallback mode is not ErrUnavailable.
func TestClaimFallbackEveryExecMode(t *testing.T) {
	for _, mode := range execModes {
		t.Run(mode, func(t *testing.T) {
			s, p := openTestStore(t, "pool_max_conns=1&default_query_exec_mode="+mode)
			p.genericPlan = refusedSetting
			ctx := context.Background()
			a, b := testClaim(), testClaim()
			for i, c := range []Claim{a, b, a, b} {
				res, err := s.Claim(ctx, []Claim{c})
				if err != nil {
					t.Fatalf("claim %d: %v", i, err)
				}
				if want := i < 2; res[0].Claimed != want || res[0].Row.Attempt != 1 {
					t.Fatalf("claim %d: claimed %v attempt %d, want claimed %v attempt 1", i, res[0].Claimed, res[0].Row.Attempt, want)
				}
				if !p.noGenericPlan.Load() {
					t.Fatalf("claim %d: refusal not remembered", i)
				}
			}
			// The very first claim of a fresh store takes the fallback in
			// the same round: run it on a batch of two.
			s2, p2 := openTestStore(t, "pool_max_conns=1&default_query_exec_mode="+mode)
			p2.genericPlan = refusedSetting
			c, d := testClaim(), testClaim()
			res, err := s2.Claim(ctx, []Claim{c, d})
			if err != nil || !res[0].Claimed || !res[1].Claimed {
				t.Fatalf("batch of two on the fallback round: %v %+v", err, res)
			}
			bad := testClaim()
			bad.ConversationID = "a\xffb" // 22021 (a NUL is 08P01 in simple_protocol)
			_, err = s.Claim(ctx, []Claim{bad})
			t.Logf("bad claim in fallback mode: %v", err)
			if err == nil || errors.Is(err, ErrUnavailable) {
				t.Fatalf("data error in fallback mode: %v", err)
			}
		})
	}
}

// TestClaimFallbackClosesBatchOnce: on the 42704 path
// claimRound closes the batch (which releases the pool connection), runs
// the claim alone (on the same connection: the pool has one), and then the
// deferred results.Close runs again. The second Close calls the inner
// batch's Close, whose deferred invalidateCachesOnBatchResultsError still
// holds the *pgx.Conn and the batch's error: it invalidates the claim's
// prepared statement in the cache of a connection the batch no longer
// owns, the one the fallback just prepared it on. Observable: right after
// the fallback claim, the claim statement is no longer prepared on the
// connection (the next query on it deallocates it), although nothing else
// ran.
func TestClaimFallbackClosesBatchOnce(t *testing.T) {
	s, p := openTestStore(t, "pool_max_conns=1&default_query_exec_mode=cache_statement")
	ctx := context.Background()
	p.genericPlan = refusedSetting
	if _, err := s.Claim(ctx, []Claim{testClaim()}); err != nil {
		t.Fatal(err)
	}
	prepared := func() int {
		var n int
		if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE statement = $1`, claimPostgres).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	afterFallback := prepared()
	// Control: a claim in fallback mode (noGenericPlan already set) is
	// queryRows alone and leaves its statement prepared.
	if _, err := s.Claim(ctx, []Claim{testClaim()}); err != nil {
		t.Fatal(err)
	}
	afterPlain := prepared()
	t.Logf("claim statement prepared on the connection: %d after the fallback claim, %d after a plain claim", afterFallback, afterPlain)
	if afterFallback != afterPlain {
		t.Fatalf("the fallback claim's deferred second Close invalidated the statement cache of the released connection (prepared %d, want %d)", afterFallback, afterPlain)
	}
}

// TestClaimFallbackCloseRace: the same second Close, with another
// goroutine using the pool's one connection meanwhile. Run with -race: the
// deferred invalidation writes the connection's statement cache (a map and
// a list, not safe for concurrent use) with no synchronisation with the
// goroutine that now holds the connection.
func TestClaimFallbackCloseRace(t *testing.T) {
	if !raceEnabled {
		t.Skip("needs the race detector: go test -race")
	}
	s, p := openTestStore(t, "pool_max_conns=1&default_query_exec_mode=cache_statement")
	ctx := context.Background()
	p.genericPlan = refusedSetting
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			// A statement the claim's batch also queued: its cache entry is
			// what the stray invalidation deletes.
			rows, err := p.pool.Query(ctx, claimPostgres, []string{}, []string{}, []int64{}, []string{}, []int64{}, []string{},
				[]string{}, []string{}, []string{}, []string{}, []int64{}, []string{})
			if err == nil {
				rows.Close()
			}
		}
	}()
	// Each iteration is a process's first claim on such a server (the
	// refusal is remembered per postgresDB): reset the flag to reopen the
	// window, as a fresh store would.
	deadline := time.Now().Add(3 * time.Second)
	for n := 0; n < 200 && time.Now().Before(deadline); n++ {
		p.noGenericPlan.Store(false)
		if _, err := s.Claim(ctx, []Claim{testClaim()}); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
}

// TestQueriesByKeyFallBackEveryExecMode: on a server that refuses the
// setting that keeps lookups by key off sequential scans (an engine built
// on Postgres that does not know it), a completion batch and a claim that
// reads settled rows first still answer, in every pgx exec mode: the
// refusal arrives before the statement runs, and from then on the
// statement goes without the setting.
func TestQueriesByKeyFallBackEveryExecMode(t *testing.T) {
	for _, mode := range execModes {
		t.Run(mode, func(t *testing.T) {
			s, p := openTestStore(t, "pool_max_conns=1&default_query_exec_mode="+mode)
			p.indexOnly = refusedSetting
			p.settledShare.pinned = true
			ctx := context.Background()
			c := testClaim()
			res, err := s.Claim(ctx, []Claim{c})
			if err != nil || !res[0].Claimed {
				t.Fatalf("claim: %v %+v", err, res)
			}
			errs, err := s.CompleteBatch(ctx, []Completion{{Fence: res[0].Row.Fence(), Output: []byte(`{"ok":true}`)}})
			if err != nil || errs[0] != nil {
				t.Fatalf("completion on a server refusing the setting: %v %v", err, errs)
			}
			if !p.noIndexOnly.Load() {
				t.Fatal("refusal not remembered")
			}
			for i := range 3 {
				c.ToolUseID = "toolu_retried"
				res, err := s.Claim(ctx, []Claim{c})
				if err != nil || res[0].Claimed || res[0].Row.State != Completed || string(res[0].Row.Result) != `{"ok":true}` {
					t.Fatalf("duplicate %d, its settled row read first: %v %+v", i, err, res)
				}
			}
			// A store whose first refusal comes on the settled read.
			s2, p2 := openTestStore(t, "pool_max_conns=1&default_query_exec_mode="+mode)
			d := testClaim()
			res, err = s2.Claim(ctx, []Claim{d})
			if err != nil || !res[0].Claimed || s2.Complete(ctx, res[0].Row.Fence(), []byte(`{}`)) != nil {
				t.Fatalf("claim and complete: %v %+v", err, res)
			}
			p2.indexOnly, p2.settledShare.pinned = refusedSetting, true
			if res, err := s2.Claim(ctx, []Claim{d}); err != nil || res[0].Claimed || res[0].Row.State != Completed || !p2.noIndexOnly.Load() {
				t.Fatalf("a claim read first on a server refusing the setting: %v %+v", err, res)
			}
		})
	}
}
