package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
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

// TestCompleteTxOfATakenOverClaimRollsBackItsEffect: a holder whose lease
// was taken over while its effect ran is fenced out when it completes, and
// its effect never lands; the new holder's does.
func TestCompleteTxOfATakenOverClaimRollsBackItsEffect(t *testing.T) {
	t.Parallel()
	s, pool := txStore(t, nil)
	ctx := context.Background()
	c := newClaim(300 * time.Millisecond)
	c.Token = newToken()
	stale := mustClaim(t, s, c)
	var taken ledger.Row
	_, err := s.CompleteTx(ctx, stale.Fence(), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
		out, err := insertEffect(c.Key)(ctx, tx)
		waitExpired(t, s, c.Key)
		var terr error
		if taken, terr = s.Takeover(ctx, stale.Fence(), "taker", newToken(), time.Minute); terr != nil {
			t.Error(terr)
		}
		return out, err
	})
	isErr(t, err, ledger.ErrFenced)
	if n := effects(t, pool, c.Key); n != 0 {
		t.Fatalf("%d effects of a fenced holder", n)
	}
	if _, err := s.CompleteTx(ctx, taken.Fence(), insertEffect(c.Key)); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, c.Key); got.State != ledger.Completed || got.Attempt != 2 || effects(t, pool, c.Key) != 1 {
		t.Fatalf("row %+v, %d effects", got, effects(t, pool, c.Key))
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
	proxy.CutResponse("commit\x00") // pgx's COMMIT, a simple query
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
