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

// loadSQL loads one transactional_write whose sql executor runs stmt.
func loadSQL(stmt string) error {
	quoted, _ := json.Marshal(stmt)
	_, err := tools.Parse([]byte(`tools:
  - name: t
    class: transactional_write
    schema: {type: object}
    sql:
      statement: `+string(quoted)+`
      output: affected
`), "test", tools.Config{})
	return err
}

// TestSQLStatementThatEndsOrReconfiguresTheTransactionIsALoadError: every
// statement that is not one of the kinds a sql executor runs, however it is
// written (cased, after comments, which nest, or parentheses), and every
// such statement after one that is (two statements), is a load error; so
// is a positional parameter and anything left unterminated.
func TestSQLStatementThatEndsOrReconfiguresTheTransactionIsALoadError(t *testing.T) {
	t.Parallel()
	refused := []string{
		"COMMIT", "ROLLBACK", "BEGIN", "START TRANSACTION", "END", "ABORT", "SAVEPOINT s", "RELEASE SAVEPOINT s",
		"ROLLBACK TO SAVEPOINT s", "PREPARE TRANSACTION 'x'", "COMMIT PREPARED 'x'", "SET statement_timeout = 1",
		"SET SESSION AUTHORIZATION DEFAULT", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", "RESET ALL", "DISCARD ALL",
		"LISTEN x", "NOTIFY x", "LOCK refunds", "DO $$ BEGIN COMMIT; END $$", "COPY refunds FROM STDIN", "VACUUM",
		"CREATE TABLE x (a int)", "DROP TABLE refunds", "TRUNCATE refunds", "PREPARE p AS SELECT 1", "EXECUTE p",
		"DECLARE c CURSOR WITH HOLD FOR SELECT 1", "EXPLAIN ANALYZE DELETE FROM refunds", "GRANT ALL ON refunds TO PUBLIC",
	}
	disguises := map[string]func(string) string{
		"as written":                  func(s string) string { return s },
		"lower case":                  strings.ToLower,
		"after a line comment":        func(s string) string { return "-- a note\n" + s },
		"after a block comment":       func(s string) string { return "/* SELECT */ " + s },
		"after a nested comment":      func(s string) string { return "/* /* */ SELECT */ " + s },
		"in parentheses":              func(s string) string { return "((" + s + "))" },
		"after a statement":           func(s string) string { return "UPDATE refunds SET amount_cents = amount_cents; " + s },
		"after a statement, then one": func(s string) string { return "SELECT 1;" + s + "; SELECT 2" },
		"after a string with a quote": func(s string) string { return "SELECT 'it''s'; " + s },
		"after a dollar-quoted body":  func(s string) string { return "SELECT $q$ ' $q$; " + s },
		"after an escape string":      func(s string) string { return `SELECT E'\''; ` + s },
		"after a quoted identifier":   func(s string) string { return `SELECT 1 AS "a;"; ` + s },
	}
	for _, stmt := range refused {
		for name, disguise := range disguises {
			if err := loadSQL(disguise(stmt)); err == nil {
				t.Errorf("%s, %s: loaded: %s", stmt, name, disguise(stmt))
			}
		}
	}
	for _, stmt := range []string{
		"INSERT INTO refunds (order_id) VALUES ($1)",
		"SELECT * FROM refunds WHERE id = $12",
		"SELECT /* /* */ 1",
		"SELECT 'unterminated",
		`SELECT "unterminated`,
		"SELECT $q$ unterminated $Q$",
		`SELECT E'\'`,
		"",
		"   -- nothing but a comment",
		"'a string'",
	} {
		if err := loadSQL(stmt); err == nil {
			t.Errorf("loaded: %q", stmt)
		}
	}
}

// TestSQLStatementOfOneKindLoads: a semicolon, a $, a COMMIT or a comment
// marker inside a string, a dollar-quoted string, a quoted identifier or
// a comment, a $ in an identifier, and semicolons that end the statement,
// do not make it two statements or another kind.
func TestSQLStatementOfOneKindLoads(t *testing.T) {
	t.Parallel()
	for _, stmt := range []string{
		"INSERT INTO refunds (note) VALUES ('a; COMMIT; --')",
		"INSERT INTO refunds (note) VALUES ('it''s; $1')",
		`INSERT INTO refunds (note) VALUES (E'\'; COMMIT; \\')`,
		"INSERT INTO refunds (note) VALUES ($$; COMMIT$$), ($tag$ $$; $1 $tag$)",
		`SELECT 1 AS "; COMMIT"`,
		"SELECT 1 -- ; COMMIT",
		"SELECT 1 /* ; /* nested; */ COMMIT */",
		"SELECT price$1 FROM items",
		"SELECT 1;",
		"SELECT 1 ; ;  -- done",
		"/* first */ (SELECT 1)",
		"with x AS (SELECT 1) SELECT * FROM x",
		"CALL refund()",
		"values (1)",
		"MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE",
	} {
		if err := loadSQL(stmt); err != nil {
			t.Errorf("%q: %v", stmt, err)
		}
	}
}

// TestSQLRefusesANumberItWouldNotBindAsWritten: a number in a member the
// statement binds, at any depth, whose value is not exactly that of the
// double it reads as, is invalid args; one that is, however it is written,
// is valid, and so are numbers in members the statement does not bind.
func TestSQLRefusesANumberItWouldNotBindAsWritten(t *testing.T) {
	t.Parallel()
	tool := sqlTool(t, `{type: object, properties: {n: {}, doc: {}, other: {}}}`, `{statement: "SELECT @n::text AS n, @doc::text AS doc"}`)
	for args, valid := range map[string]bool{
		`{"n":1}`:                                true,
		`{"n":1.0}`:                              true,
		`{"n":-0}`:                               true,
		`{"n":0.1}`:                              true,
		`{"n":1.5e3}`:                            true,
		`{"n":1E+21}`:                            true,
		`{"n":100e-2}`:                           true,
		`{"n":9007199254740991}`:                 true,
		`{"n":1.7976931348623157e308}`:           true,
		`{"n":5e-324}`:                           true,
		`{"n":"1.000000000000000001"}`:           true,
		`{"other":0.30000000000000001}`:          true,
		`{"n":1.000000000000000001}`:             false,
		`{"n":0.30000000000000001}`:              false,
		`{"n":123456789.123456789}`:              false,
		`{"n":1e-400}`:                           false,
		`{"n":2.5e-324}`:                         false,
		`{"doc":{"a":[1,2.000000000000000001]}}`: false,
	} {
		err := tool.Validate(json.RawMessage(args))
		switch {
		case valid && err != nil:
			t.Errorf("%s: %v", args, err)
		case !valid && (!errors.Is(err, tools.ErrInvalidArgs) || !strings.Contains(err.Error(), "send it as a string")):
			t.Errorf("%s: %v, want it refused", args, err)
		}
	}
}

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

// TestTxExecutorDeferredConstraintFailsTheEffect: a constraint the
// executor's writes break, deferred to the commit, is checked when the
// executor returns: a definite failure with its SQLSTATE, before the
// transaction commits anything.
func TestTxExecutorDeferredConstraintFailsTheEffect(t *testing.T) {
	t.Parallel()
	pool := sqlDB(t, `CREATE TABLE orders (id text UNIQUE DEFERRABLE INITIALLY DEFERRED)`, `INSERT INTO orders VALUES ('o-1')`)
	tool := sqlTool(t, `{type: object, properties: {id: {type: string}}}`, `{statement: "INSERT INTO orders VALUES (@id)", output: affected}`)
	_, err := runSQL(t, pool, tool, `{"id":"o-1"}`)
	var te *tools.Error
	if !errors.As(err, &te) || te.Outcome != tools.Definite || te.Code != "sqlstate_23505" {
		t.Fatalf("got %v, want a definite sqlstate_23505", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders", n)
	}
}
