package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// txStore is a migrated Postgres ledger, reached through via(its URL)
// when via is set, with a table of effects in the same database, reached
// directly through the pool.
func txStore(t *testing.T, via func(dbURL string) string) (*ledger.Store, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	dbURL := testenv.Postgres(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (key text PRIMARY KEY, n int)`); err != nil {
		t.Fatal(err)
	}
	s, err := ledger.OpenPostgres(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if via != nil { // migrated directly: nothing but the test's own statements through via
		if s, err = ledger.OpenPostgres(ctx, via(dbURL)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
	}
	return s, pool
}

// insertEffect is an effect that writes one row for key.
func insertEffect(key string) ledger.TxEffect {
	return func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, 1)`, key); err != nil {
			return nil, err
		}
		return json.RawMessage(`{"written":true}`), nil
	}
}

func effects(t *testing.T, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCompleteTxCommitsTheEffectWithTheRow: the effect and the completed
// row are there together, and a second completion of a settled row is
// fenced, its effect rolled back.
func TestCompleteTxCommitsTheEffectWithTheRow(t *testing.T) {
	t.Parallel()
	s, pool := txStore(t, nil)
	ctx := context.Background()
	c := newClaim(time.Minute)
	c.Token = newToken()
	row := mustClaim(t, s, c)
	out, err := s.CompleteTx(ctx, row.Fence(), insertEffect(c.Key))
	if err != nil || string(out) != `{"written":true}` {
		t.Fatalf("%s, %v", out, err)
	}
	got := mustGet(t, s, c.Key)
	if got.State != ledger.Completed || string(got.Result) != `{"written":true}` || effects(t, pool, c.Key) != 1 {
		t.Fatalf("row %+v, %d effects", got, effects(t, pool, c.Key))
	}
	// Once more under the same fence: the row is settled, the effect (a
	// second row for the key would conflict; this one writes elsewhere)
	// rolls back.
	_, err = s.CompleteTx(ctx, row.Fence(), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ('again', 1)`)
		return json.RawMessage(`{}`), err
	})
	isErr(t, err, ledger.ErrFenced)
	if effects(t, pool, "again") != 0 {
		t.Fatal("the effect of a fenced completion committed")
	}
}

// TestCompleteTxOfAStaleClaimRunsNoEffect: a holder whose claim was taken
// over before its transaction began is fenced out at once: its effect never
// runs. The new holder's lands.
func TestCompleteTxOfAStaleClaimRunsNoEffect(t *testing.T) {
	t.Parallel()
	s, pool := txStore(t, nil)
	ctx := context.Background()
	c := newClaim(50 * time.Millisecond)
	c.Token = newToken()
	stale := mustClaim(t, s, c)
	waitExpired(t, s, c.Key)
	taken, err := s.Takeover(ctx, stale.Fence(), "taker", newToken(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = s.CompleteTx(ctx, stale.Fence(), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
		ran = true
		return insertEffect(c.Key)(ctx, tx)
	})
	isErr(t, err, ledger.ErrFenced)
	if ran {
		t.Fatal("the effect of a stale claim ran")
	}
	if _, err := s.CompleteTx(ctx, taken.Fence(), insertEffect(c.Key)); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, c.Key); got.State != ledger.Completed || got.Attempt != 2 || effects(t, pool, c.Key) != 1 {
		t.Fatalf("row %+v, %d effects", got, effects(t, pool, c.Key))
	}
}

// isolation is a txStore's via that sets the ledger's connections'
// default_transaction_isolation.
func isolation(t *testing.T, level string) func(string) string {
	return func(dbURL string) string {
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("default_transaction_isolation", level)
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads a + as itself
		return u.String()
	}
}

// TestCompleteTxHoldsItsRowAgainstATakeover: at every isolation level, a
// takeover of a lease that ran out while the transaction lives waits for
// its end instead of running the call a second time; the transaction
// commits, and the takeover finds the row completed.
func TestCompleteTxHoldsItsRowAgainstATakeover(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			s, pool := txStore(t, isolation(t, level))
			ctx := context.Background()
			c := newClaim(200 * time.Millisecond)
			c.Token = newToken()
			row := mustClaim(t, s, c)
			terr := make(chan error, 1)
			out, err := s.CompleteTx(ctx, row.Fence(), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
				out, err := insertEffect(c.Key)(ctx, tx)
				waitExpired(t, s, c.Key)
				go func() {
					_, err := s.Takeover(ctx, row.Fence(), "taker", newToken(), time.Minute)
					terr <- err
				}()
				testenv.Eventually(t, 10*time.Second, "the takeover to wait for the row", func() bool {
					var n int
					pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
						AND wait_event_type = 'Lock' AND query LIKE 'UPDATE toolq_ledger SET attempt%'`).Scan(&n)
					return n == 1
				})
				return out, err
			})
			if err != nil || string(out) != `{"written":true}` {
				t.Fatalf("%s, %v", out, err)
			}
			if err := <-terr; err == nil {
				t.Fatal("the takeover of a committed call went through")
			}
			_, err = s.Takeover(ctx, row.Fence(), "taker", newToken(), time.Minute)
			isErr(t, err, ledger.ErrFenced)
			if got := mustGet(t, s, c.Key); got.State != ledger.Completed || got.Attempt != 1 || effects(t, pool, c.Key) != 1 {
				t.Fatalf("row %+v, %d effects", got, effects(t, pool, c.Key))
			}
		})
	}
}

// TestCompleteTxRacesATakeover: a completion and a takeover of the same
// expired claim, at once, many times: exactly one of them wins, and there
// is an effect exactly when the completion won.
func TestCompleteTxRacesATakeover(t *testing.T) {
	t.Parallel()
	s, pool := txStore(t, nil)
	ctx := context.Background()
	for range 20 {
		c := newClaim(50 * time.Millisecond)
		c.Token = newToken()
		row := mustClaim(t, s, c)
		waitExpired(t, s, c.Key)
		var wg sync.WaitGroup
		var cerr, terr error
		wg.Go(func() { _, cerr = s.CompleteTx(ctx, row.Fence(), insertEffect(c.Key)) })
		wg.Go(func() { _, terr = s.Takeover(ctx, row.Fence(), "taker", newToken(), time.Minute) })
		wg.Wait()
		got, n := mustGet(t, s, c.Key), effects(t, pool, c.Key)
		switch {
		case cerr == nil && terr != nil && got.State == ledger.Completed && n == 1:
		case cerr != nil && terr == nil && got.State == ledger.InFlight && got.Attempt == 2 && n == 0:
		default:
			t.Fatalf("completion %v, takeover %v: row %+v, %d effects", cerr, terr, got, n)
		}
	}
}

// TestCompleteTxGivesBackTheEffectsError: the effect's error is returned
// as it was, after the rollback; the row is still the holder's, in flight.
func TestCompleteTxGivesBackTheEffectsError(t *testing.T) {
	t.Parallel()
	s, pool := txStore(t, nil)
	ctx := context.Background()
	c := newClaim(time.Minute)
	row := mustClaim(t, s, c)
	refused := errors.New("the effect said no")
	_, err := s.CompleteTx(ctx, row.Fence(), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
		if _, err := insertEffect(c.Key)(ctx, tx); err != nil {
			return nil, err
		}
		return nil, refused
	})
	if err != refused {
		t.Fatalf("err = %v, want the effect's own", err)
	}
	_, err = s.CompleteTx(ctx, row.Fence(), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
		return json.RawMessage(`{"bad":`), nil
	})
	isErr(t, err, ledger.ErrInvalidOutput)
	if got := mustGet(t, s, c.Key); got.State != ledger.InFlight || effects(t, pool, c.Key) != 0 {
		t.Fatalf("row %+v, %d effects", got, effects(t, pool, c.Key))
	}
	// A statement error of the effect's own: its type is the driver's, by
	// design (the effect was given a pgx.Tx).
	_, err = s.CompleteTx(ctx, row.Fence(), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
		_, err := tx.Exec(ctx, `INSERT INTO nowhere VALUES (1)`)
		return nil, err
	})
	if err == nil || errors.Is(err, ledger.ErrUnavailable) {
		t.Fatalf("err = %v", err)
	}
}

// TestCompleteTxWhoseCommitAnswerIsLost: the connection breaks after the
// commit was sent; the row tells that it landed, with its effect, and a
// release under the same fence is refused.
func TestCompleteTxWhoseCommitAnswerIsLost(t *testing.T) {
	t.Parallel()
	var proxy *testenv.CutProxy
	s, pool := txStore(t, func(dbURL string) string {
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		proxy = testenv.StartCutProxy(t, u.Host)
		u.Host = proxy.Addr()
		return u.String()
	})
	ctx := context.Background()
	c := newClaim(time.Minute)
	c.Token = newToken()
	row := mustClaim(t, s, c)
	proxy.CutResponse("COMMIT\x00") // the completion's commit, a simple query
	_, err := s.CompleteTx(ctx, row.Fence(), insertEffect(c.Key))
	if err == nil || proxy.Cuts() != 1 {
		t.Fatalf("err = %v after %d cuts", err, proxy.Cuts())
	}
	testenv.Eventually(t, 10*time.Second, "the commit to land", func() bool { return mustGet(t, s, c.Key).State == ledger.Completed })
	if got := mustGet(t, s, c.Key); got.ClaimToken != c.Token || effects(t, pool, c.Key) != 1 {
		t.Fatalf("row %+v, %d effects", got, effects(t, pool, c.Key))
	}
	isErr(t, s.Release(ctx, row.Fence()), ledger.ErrFenced)
}

// TestCompleteTxNeedsPostgres: the SQLite ledger refuses, and the effect
// does not run.
func TestCompleteTxNeedsPostgres(t *testing.T) {
	t.Parallel()
	s := openStore(t, "sqlite")
	row := mustClaim(t, s, newClaim(time.Minute))
	ran := false
	_, err := s.CompleteTx(context.Background(), row.Fence(), func(context.Context, pgx.Tx) (json.RawMessage, error) {
		ran = true
		return json.RawMessage(`{}`), nil
	})
	isErr(t, err, ledger.ErrTxUnsupported)
	if ran {
		t.Fatal("the effect ran")
	}
}

// TestAnIdleTransactionEndsAtItsDeadline: a holder that stops in the middle
// of its transaction (as one cut off from the database would) holds what
// it wrote only until the deadline of its context: then the server ends
// the transaction, and another writer of the same key goes through.
func TestAnIdleTransactionEndsAtItsDeadline(t *testing.T) {
	t.Parallel()
	s, pool := txStore(t, nil)
	c := newClaim(time.Minute)
	row := mustClaim(t, s, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	wrote, resume := make(chan struct{}), make(chan struct{})
	stopWaiting := sync.OnceFunc(func() { close(resume) })
	defer stopWaiting() // a failed test lets the holder go, so that the store closes
	done := make(chan error, 1)
	go func() {
		_, err := s.CompleteTx(ctx, row.Fence(), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
			out, err := insertEffect(c.Key)(ctx, tx)
			close(wrote)
			<-resume // stopped, whatever ctx says
			return out, err
		})
		done <- err
	}()
	<-wrote
	start := time.Now()
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	if _, err := pool.Exec(wctx, `INSERT INTO effects VALUES ($1, 2)`, c.Key); err != nil {
		t.Fatalf("the other writer: %v after %s", err, time.Since(start))
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("the other writer waited %s", waited)
	}
	stopWaiting()
	if err := <-done; err == nil {
		t.Fatal("a transaction the server ended committed")
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT n FROM effects WHERE key = $1`, c.Key).Scan(&n); err != nil || n != 2 {
		t.Fatalf("effect %d, %v", n, err)
	}
	if got := mustGet(t, s, c.Key); got.State != ledger.InFlight {
		t.Fatalf("row %+v", got)
	}
}

// TestCompleteTxFindsAnEffectThatEndedItsTransaction: an effect that
// commits or rolls back the transaction it was given, whatever it returns
// after (output, an error) and whether or not it begins another, is found:
// ErrTxEnded, never a completion, and never a plain rollback that would let
// the call run again over what it committed. The row is left in flight.
func TestCompleteTxFindsAnEffectThatEndedItsTransaction(t *testing.T) {
	t.Parallel()
	s, pool := txStore(t, nil)
	refused := errors.New("the effect said no")
	for name, c := range map[string]struct {
		statements []string
		err        error
		effects    int
	}{
		"COMMIT, then output":               {[]string{"COMMIT"}, nil, 1},
		"COMMIT, then an error":             {[]string{"COMMIT"}, refused, 1},
		"ROLLBACK, then output":             {[]string{"ROLLBACK"}, nil, 0},
		"COMMIT and BEGIN, then output":     {[]string{"COMMIT", "BEGIN"}, nil, 1},
		"COMMIT and BEGIN, then an error":   {[]string{"COMMIT", "BEGIN"}, refused, 1},
		"COMMIT; BEGIN in one, then output": {[]string{"COMMIT; BEGIN"}, nil, 1},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			claim := newClaim(time.Minute)
			claim.Token = newToken()
			row := mustClaim(t, s, claim)
			_, err := s.CompleteTx(context.Background(), row.Fence(), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
				if _, err := insertEffect(claim.Key)(ctx, tx); err != nil {
					return nil, err
				}
				for _, stmt := range c.statements {
					if _, err := tx.Exec(ctx, stmt); err != nil {
						return nil, err
					}
				}
				return json.RawMessage(`{}`), c.err
			})
			isErr(t, err, ledger.ErrTxEnded)
			if got := mustGet(t, s, claim.Key); got.State != ledger.InFlight || got.Fence() != row.Fence() || effects(t, pool, claim.Key) != c.effects {
				t.Fatalf("row %+v, %d effects", got, effects(t, pool, claim.Key))
			}
		})
	}
}

// TestCompleteTxConflictIsNotAnOutage: an effect whose foreign key check
// is deferred to the commit deadlocks there with another transaction (the
// commit waits for the parent row the other holds, the other for a row the
// effect wrote). It is rolled back, the row is as it was, and the error is
// not ErrUnavailable: the call's own transaction conflicted, and a retry of
// the call is a try of it.
func TestCompleteTxConflictIsNotAnOutage(t *testing.T) {
	t.Parallel()
	s, pool := txStore(t, nil)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent VALUES (1);
		CREATE TABLE child (parent_id int REFERENCES parent DEFERRABLE INITIALLY DEFERRED);
		CREATE TABLE other (id int PRIMARY KEY); INSERT INTO other VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	claim := newClaim(time.Minute)
	claim.Token = newToken()
	row := mustClaim(t, s, claim)
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	// The holder checks for a deadlock long after the commit does, so that
	// the commit's check, not the holder's, finds the cycle however late a
	// loaded machine runs either.
	if _, err := holder.Exec(ctx, `SET LOCAL deadlock_timeout = '60s'; SELECT * FROM parent WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	holderDone := make(chan error, 1)
	holding := false // the holder's statement was started: wait for it before the deferred rollback
	_, err = s.CompleteTx(ctx, row.Fence(), func(txCtx context.Context, tx pgx.Tx) (json.RawMessage, error) {
		if _, err := tx.Exec(txCtx, `UPDATE other SET id = 1 WHERE id = 1; INSERT INTO child VALUES (1)`); err != nil {
			return nil, err
		}
		if _, err := insertEffect(claim.Key)(txCtx, tx); err != nil {
			return nil, err
		}
		go func() {
			// Once the commit waits for the parent row, the holder waits for
			// the row the effect wrote: the commit's wait began first, so its
			// deadlock check finds the cycle first. The holder runs on the
			// test's context: the effect's ends with CompleteTx, which can
			// return before the holder's statement does.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				var n int
				pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
					AND wait_event_type = 'Lock' AND query LIKE '%COMMIT'`).Scan(&n)
				if n == 1 {
					break
				}
			}
			_, err := holder.Exec(ctx, `UPDATE other SET id = 1 WHERE id = 1`)
			holderDone <- err
		}()
		holding = true
		return json.RawMessage(`{}`), nil
	})
	var holderErr error
	if holding {
		holderErr = <-holderDone
	}
	if err == nil || errors.Is(err, ledger.ErrUnavailable) || !strings.Contains(err.Error(), "conflicted with another") {
		t.Fatalf("err = %v, want the conflict (the other transaction: %v)", err, holderErr)
	}
	if holderErr != nil {
		t.Fatalf("the other transaction: %v", holderErr)
	}
	if got := mustGet(t, s, claim.Key); got.State != ledger.InFlight || got.Fence() != row.Fence() || effects(t, pool, claim.Key) != 0 {
		t.Fatalf("row %+v, %d effects", got, effects(t, pool, claim.Key))
	}
}

// TestCompleteTxLeavesNoSessionState: on a ledger of one connection, an
// effect that leaves what a statement can leave on its session (an advisory
// lock, a setting, a temporary table, a LISTEN, a cursor WITH HOLD) leaves
// nothing of it to the next statement on that connection, whether it
// committed or failed; the connection's own settings (from its URL) stay.
func TestCompleteTxLeavesNoSessionState(t *testing.T) {
	t.Parallel()
	s, _ := txStore(t, func(dbURL string) string {
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("pool_max_conns", "1")
		q.Set("application_name", "ledger-under-test")
		u.RawQuery = q.Encode()
		return u.String()
	})
	ctx := context.Background()
	leave := func(ctx context.Context, tx pgx.Tx) error {
		for _, stmt := range []string{
			`SELECT pg_advisory_lock(42)`,
			`SELECT set_config('statement_timeout', '1234', false)`,
			`SELECT 1 AS n INTO TEMP leftover`,
			`LISTEN leftover`,
			`DECLARE leftover CURSOR WITH HOLD FOR SELECT 1`,
		} {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("%s: %w", stmt, err)
			}
		}
		return nil
	}
	var session string
	look := func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
		err := tx.QueryRow(ctx, `SELECT concat_ws(' ',
			(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
			current_setting('statement_timeout'), to_regclass('pg_temp.leftover') IS NULL,
			(SELECT count(*) FROM pg_listening_channels()), (SELECT count(*) FROM pg_cursors WHERE name = 'leftover'),
			current_setting('application_name'))`).Scan(&session)
		return json.RawMessage(`{}`), err
	}
	const clean = `0 0 t 0 0 ledger-under-test`
	for _, outcome := range []string{"committed", "failed"} {
		claim := newClaim(time.Minute)
		row := mustClaim(t, s, claim)
		_, err := s.CompleteTx(ctx, row.Fence(), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
			if err := leave(ctx, tx); err != nil {
				return nil, err
			}
			if outcome == "failed" {
				return nil, errors.New("the effect said no")
			}
			return json.RawMessage(`{}`), nil
		})
		if (err == nil) != (outcome == "committed") {
			t.Fatalf("%s: %v", outcome, err)
		}
		next := mustClaim(t, s, newClaim(time.Minute))
		if _, err := s.CompleteTx(ctx, next.Fence(), look); err != nil {
			t.Fatal(err)
		}
		if session != clean {
			t.Fatalf("after an effect that %s, the session is %q, want %q", outcome, session, clean)
		}
	}
}
