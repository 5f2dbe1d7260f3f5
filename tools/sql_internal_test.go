package tools

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolq/toolq/internal/testenv"
)

// TestSQLRunsOneStatementWhateverTheConnectionsMode: on connections whose
// default is pgx's simple protocol (which runs every statement of a text),
// a statement text that holds three (the registry refuses it; here it is
// given directly) is refused by Postgres as a whole: nothing of it runs, the
// call's transaction is still the one it was given, and it fails
// definitely. A statement of one kind runs, its parameters bound.
func TestSQLRunsOneStatementWhateverTheConnectionsMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := url.Parse(testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("default_query_exec_mode", "simple_protocol")
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE t (key text)`); err != nil {
		t.Fatal(err)
	}
	for _, output := range []string{SQLAffected, SQLRows} {
		s := &SQL{Statement: "INSERT INTO t VALUES ('smuggled'); COMMIT; BEGIN", Output: output, MaxOutputBytes: 1 << 10}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.ExecuteTx(ctx, tx, Request{Key: "k", Args: json.RawMessage(`{}`)})
		status := tx.Conn().PgConn().TxStatus()
		tx.Rollback(ctx)
		var te *Error
		if !errors.As(err, &te) || te.Outcome != Definite || te.Code != "sqlstate_42601" || status != 'E' {
			t.Errorf("%s: %v, transaction status %c", output, err, status)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows (%v)", n, err)
	}
	s, err := SQLExecutor(SQL{Statement: "INSERT INTO t VALUES (@key) RETURNING key", Output: SQLRow})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if out, err := s.ExecuteTx(ctx, tx, Request{Key: "k'; --", Args: json.RawMessage(`{}`)}); err != nil || string(out) != `{"key":"k'; --"}` {
		t.Fatalf("%s, %v", out, err)
	}
}
