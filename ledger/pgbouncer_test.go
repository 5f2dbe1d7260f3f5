package ledger_test

// The ledger behind PgBouncer in transaction mode. The conformance suite
// runs through it as eachBackend's "pgbouncer" backend (a pgbouncer in
// front of the test cluster, started once per test binary: see
// testenv.PgBouncerThrough); these tests pin what the suite takes for
// granted about it, and the transactional write through it.

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// TestThePgBouncerBackendPoolsTransactions: the "pgbouncer" backend gives
// one server connection to one client's transaction after another's: in
// session mode the second client would get a server connection of its own.
func TestThePgBouncerBackendPoolsTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testenv.PgBouncerPostgres(t)
	t.Logf("through %s", dbURL)
	if v, err := testenv.PgBouncerVersion(); err == nil {
		t.Logf("%s", v)
	}
	pid := func(conn *pgx.Conn) int {
		var n int
		if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var conns [2]*pgx.Conn
	for i := range conns {
		c, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		conns[i] = c
	}
	first := pid(conns[0])
	if second := pid(conns[1]); second != first {
		t.Fatalf("the second client's transaction ran on server backend %d, the first's on %d: not transaction pooling", second, first)
	}
}

// TestCompleteTxThroughPgBouncer: through PgBouncer in transaction mode,
// on a ledger of one client connection, a transactional write's effect
// commits with its row, a failing effect leaves neither, a fenced one
// rolls back, and the reset after each leaves the connection serving the
// next claim.
func TestCompleteTxThroughPgBouncer(t *testing.T) {
	t.Parallel()
	s, pool := txStore(t, func(dbURL string) string {
		return testenv.PgBouncerThrough(t, dbURL) + "&pool_max_conns=1"
	})
	ctx := context.Background()
	for round := range 3 {
		c := newClaim(time.Minute)
		c.Token = newToken()
		row := mustClaim(t, s, c)
		said := errors.New("the effect said no")
		_, err := s.CompleteTx(ctx, row.Fence(), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
			if _, err := insertEffect(c.Key)(ctx, tx); err != nil {
				return nil, err
			}
			return nil, said
		})
		if !errors.Is(err, said) {
			t.Fatalf("round %d: failing effect: %v", round, err)
		}
		if got := mustGet(t, s, c.Key); got.State != ledger.InFlight || effects(t, pool, c.Key) != 0 {
			t.Fatalf("round %d: after a failing effect: row %+v, %d effects", round, got, effects(t, pool, c.Key))
		}
		out, err := s.CompleteTx(ctx, row.Fence(), insertEffect(c.Key))
		if err != nil || string(out) != `{"written":true}` {
			t.Fatalf("round %d: %s, %v", round, out, err)
		}
		if got := mustGet(t, s, c.Key); got.State != ledger.Completed || effects(t, pool, c.Key) != 1 {
			t.Fatalf("round %d: row %+v, %d effects", round, got, effects(t, pool, c.Key))
		}
		_, err = s.CompleteTx(ctx, row.Fence(), insertEffect(c.Key+"-again"))
		isErr(t, err, ledger.ErrFenced)
		if effects(t, pool, c.Key+"-again") != 0 {
			t.Fatalf("round %d: the effect of a fenced completion committed", round)
		}
	}
}
