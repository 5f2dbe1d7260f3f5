package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/toolq/toolq/tools"
)

// TestTxExecutorErrorsAreClassifiedBySQLState: a Go executor's error of
// Postgres's, returned as the driver gave it, is classified by its
// SQLSTATE as the sql executor's are.
func TestTxExecutorErrorsAreClassifiedBySQLState(t *testing.T) {
	t.Parallel()
	pool := sqlDB(t, `CREATE TABLE once (id int PRIMARY KEY)`, `INSERT INTO once VALUES (1)`)
	for stmt, want := range map[string]tools.Outcome{
		`INSERT INTO once VALUES (1)`:                   tools.Definite,
		`SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`:  tools.Definite,
		`SELECT pg_terminate_backend(pg_backend_pid())`: tools.NotSent,
	} {
		reg, err := tools.NewRegistry([]tools.Definition{{Name: "t", Class: tools.TransactionalWrite, Schema: json.RawMessage(`{"type":"object"}`),
			TxExecutor: tools.TxExecutorFunc(func(ctx context.Context, tx pgx.Tx, _ tools.Request) (json.RawMessage, error) {
				if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
					return nil, err
				}
				_, err := tx.Exec(ctx, stmt)
				return json.RawMessage(`{}`), fmt.Errorf("wrapped: %w", err)
			})}}, tools.Config{})
		if err != nil {
			t.Fatal(err)
		}
		tool, _ := reg.Lookup("t")
		_, err = runSQL(t, pool, tool, `{}`)
		var te *tools.Error
		if !errors.As(err, &te) || te.Outcome != want || !strings.HasPrefix(te.Code, "sqlstate_") {
			t.Errorf("%s: %v, want %s with its SQLSTATE", stmt, err, want)
		}
	}
}
