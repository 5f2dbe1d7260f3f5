package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/tools"
)

// txNothing is a transactional executor that writes nothing.
var txNothing = tools.TxExecutorFunc(func(context.Context, pgx.Tx, tools.Request) (json.RawMessage, error) {
	return json.RawMessage(`{}`), nil
})

// sqlDB is a pool on a fresh database where ddl has run.
func sqlDB(t *testing.T, ddl ...string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, stmt := range ddl {
		if _, err := pool.Exec(context.Background(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	return pool
}

// sqlTool loads one transactional_write tool from YAML: its schema and
// its sql executor.
func sqlTool(t *testing.T, schema, sql string) *tools.Tool {
	t.Helper()
	reg, err := tools.Parse([]byte(`tools:
  - name: t
    class: transactional_write
    timeout: 2s
    schema: `+schema+`
    sql: `+sql+"\n"), "test", tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("t")
	return tool
}

// commitIn runs an effect in a transaction of pool and commits it, as the
// ledger does without the completion.
func commitIn(pool *pgxpool.Pool) tools.InTx {
	return func(ctx context.Context, effect func(context.Context, pgx.Tx) (json.RawMessage, error)) (json.RawMessage, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		out, err := effect(ctx, tx)
		if err != nil {
			return nil, err
		}
		return out, tx.Commit(ctx)
	}
}

// runSQL validates args and runs one call of tool in a transaction of pool.
func runSQL(t *testing.T, pool *pgxpool.Pool, tool *tools.Tool, args string) (json.RawMessage, error) {
	t.Helper()
	if err := tool.Validate(json.RawMessage(args)); err != nil {
		t.Fatal(err)
	}
	req := tools.Request{Tool: tool.Name, Key: "key-1", Args: json.RawMessage(args), ToolUseID: "toolu_1", ConversationID: "conv-1", TurnIndex: 3, Attempt: 1}
	return tool.RunTx(context.Background(), req, commitIn(pool))
}

func count(t *testing.T, pool *pgxpool.Pool, query string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSQLArgsAreDataNeverStatementText: an arg written to break out of
// a string literal is stored as the string it is, and the table survives.
func TestSQLArgsAreDataNeverStatementText(t *testing.T) {
	t.Parallel()
	pool := sqlDB(t, `CREATE TABLE notes (id bigserial PRIMARY KEY, body text, idempotency_key text UNIQUE, conversation_id text, turn_index int, tool_use_id text)`)
	tool := sqlTool(t, `{type: object, properties: {body: {type: string}}, required: [body]}`,
		`{statement: "INSERT INTO notes (body, idempotency_key, conversation_id, turn_index, tool_use_id) VALUES (@body, @key, @conversation_id, @turn_index, @tool_use_id) RETURNING body, idempotency_key, conversation_id, turn_index, tool_use_id", output: row}`)
	evil := `'); DROP TABLE notes; --`
	args, _ := json.Marshal(map[string]string{"body": evil})
	out, err := runSQL(t, pool, tool, string(args))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"body":%q,"idempotency_key":"key-1","conversation_id":"conv-1","turn_index":3,"tool_use_id":"toolu_1"}`, evil)
	if string(out) != want {
		t.Fatalf("output %s, want %s", out, want)
	}
	if n := count(t, pool, `SELECT count(*) FROM notes WHERE body = '''); DROP TABLE notes; --'`); n != 1 {
		t.Fatalf("%d notes hold the arg as written", n)
	}
}

// TestSQLBindsEachTypeAsPostgresReadsIt: a number as written (the largest
// integer a key allows, 2^53-1, and a decimal into numeric exactly),
// booleans, objects as jsonb, an absent member as NULL; columns come back
// as JSON of their own types.
func TestSQLBindsEachTypeAsPostgresReadsIt(t *testing.T) {
	t.Parallel()
	pool := sqlDB(t, `CREATE TABLE v (i int, b bigint, n numeric, f float8, ok bool, doc jsonb, s text, at timestamptz, id uuid, missing text)`)
	tool := sqlTool(t, `{type: object, properties: {i: {type: integer}, b: {type: integer}, n: {type: number}, f: {type: number},
      ok: {type: boolean}, doc: {type: object}, s: {type: string}, at: {type: string}, id: {type: string}, missing: {type: string}}}`,
		`{statement: "INSERT INTO v VALUES (@i, @b, @n, @f, @ok, @doc, @s, @at, @id, @missing) RETURNING *", output: row}`)
	out, err := runSQL(t, pool, tool, `{"at":"2026-01-02T03:04:05Z","b":9007199254740991,"doc":{"a":[1,"x"]},"f":1.5,"i":42,"id":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","n":0.1,"ok":true,"s":"héllo"}`)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"i":42,"b":9007199254740991,"n":0.1,"f":1.5,"ok":true,"doc":{"a": [1, "x"]},"s":"héllo","at":"2026-01-02 03:04:05+00","id":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","missing":null}`
	if string(out) != want {
		t.Fatalf("output\n%s\nwant\n%s", out, want)
	}
	if !json.Valid(out) {
		t.Fatal("output is not JSON")
	}
}

// TestSQLOutputs: rows, row and affected, and the definite failures of
// row (none, or more than one), which roll the transaction back.
func TestSQLOutputs(t *testing.T) {
	t.Parallel()
	pool := sqlDB(t, `CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL)`, `INSERT INTO items VALUES (1, 5), (2, 5)`)
	schema := `{type: object, properties: {qty: {type: integer}}}`
	for _, c := range []struct {
		name, sql, want, code string
	}{
		{"rows", `{statement: "UPDATE items SET qty = qty - @qty RETURNING id, qty"}`, `[{"id":1,"qty":4},{"id":2,"qty":4}]`, ""},
		{"rows of none", `{statement: "UPDATE items SET qty = qty - @qty WHERE qty < 0 RETURNING id"}`, `[]`, ""},
		{"affected", `{statement: "UPDATE items SET qty = qty - @qty", output: affected}`, `{"rows_affected":2}`, ""},
		{"row", `{statement: "UPDATE items SET qty = qty - @qty WHERE id = 1 RETURNING qty", output: row}`, `{"qty":4}`, ""},
		{"row of none", `{statement: "UPDATE items SET qty = qty - @qty WHERE id = 3 RETURNING qty", output: row}`, "", "no_row"},
		{"row of two", `{statement: "UPDATE items SET qty = qty - @qty RETURNING qty", output: row}`, "", "more_than_one_row"},
		{"duplicate columns", `{statement: "SELECT @qty::int AS a, 2 AS a"}`, "", "duplicate_column"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := pool.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background()) // each case from the same two rows
			tool := sqlTool(t, schema, c.sql)
			out, err := tool.RunTx(context.Background(), tools.Request{Key: "k", Args: json.RawMessage(`{"qty":1}`)},
				func(ctx context.Context, effect func(context.Context, pgx.Tx) (json.RawMessage, error)) (json.RawMessage, error) {
					return effect(ctx, tx)
				})
			if c.code != "" {
				var te *tools.Error
				if !errors.As(err, &te) || te.Outcome != tools.Definite || te.Code != c.code {
					t.Fatalf("want a definite %s, got %v (%s)", c.code, err, out)
				}
				return
			}
			if err != nil || string(out) != c.want {
				t.Fatalf("got %s, %v; want %s", out, err, c.want)
			}
		})
	}
}

// TestSQLErrorsAreClassifiedBySQLState: what fails for the database's
// state at the time (a conflict, a lost connection or resource, a
// cancelled statement, a failover) left nothing and is not sent; anything
// else is the statement's own, which would fail the same way again: a
// definite failure, answered at once.
func TestSQLErrorsAreClassifiedBySQLState(t *testing.T) {
	t.Parallel()
	pool := sqlDB(t, `CREATE FUNCTION fail_with(code text) RETURNS int LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'failing with %', code USING ERRCODE = code; END $$`)
	for code, want := range map[string]tools.Outcome{
		"0A000": tools.Definite, // feature_not_supported
		"21000": tools.Definite, // cardinality_violation
		"22003": tools.Definite, // numeric_value_out_of_range
		"23502": tools.Definite, // not_null_violation
		"23505": tools.Definite, // unique_violation
		"25001": tools.Definite, // active_sql_transaction
		"2F005": tools.Definite, // function_executed_no_return_statement
		"38001": tools.Definite, // containing_sql_not_permitted
		"39004": tools.Definite, // null_value_not_allowed
		"42501": tools.Definite, // insufficient_privilege
		"42P01": tools.Definite, // undefined_table
		"54000": tools.Definite, // program_limit_exceeded: an index row too large
		"55000": tools.Definite, // object_not_in_prerequisite_state
		"P0001": tools.Definite, // raise_exception
		"08006": tools.NotSent,  // connection_failure
		"25006": tools.NotSent,  // read_only_sql_transaction: a primary demoted by a failover
		"25P03": tools.NotSent,  // idle_in_transaction_session_timeout
		"40001": tools.NotSent,  // serialization_failure
		"40P01": tools.NotSent,  // deadlock_detected
		"53100": tools.NotSent,  // disk_full
		"53300": tools.NotSent,  // too_many_connections
		"55P03": tools.NotSent,  // lock_not_available
		"57014": tools.NotSent,  // query_canceled
		"57P01": tools.NotSent,  // admin_shutdown
		"58030": tools.NotSent,  // io_error
		"XX001": tools.NotSent,  // data_corrupted
	} {
		// A tool of its own for each code: five not-sent failures in a row
		// would open one tool's breaker.
		tool := sqlTool(t, `{type: object, properties: {code: {type: string}}}`, `{statement: "SELECT fail_with(@code)"}`)
		_, err := runSQL(t, pool, tool, fmt.Sprintf(`{"code":%q}`, code))
		var te *tools.Error
		if !errors.As(err, &te) || te.Outcome != want || te.Code != "sqlstate_"+code {
			t.Errorf("SQLSTATE %s: got %v, want %s", code, err, want)
		}
	}
}

// TestSQLBreakerCountsOnlyAnUnwellDatabase: contention between calls (a
// serialization failure, a deadlock, a lock timeout) and a statement's own
// failures, however many, leave the tool's breaker closed; a database that
// refuses connections opens it.
func TestSQLBreakerCountsOnlyAnUnwellDatabase(t *testing.T) {
	t.Parallel()
	pool := sqlDB(t, `CREATE FUNCTION fail_with(code text) RETURNS int LANGUAGE plpgsql AS $$
		BEGIN IF code <> '' THEN RAISE EXCEPTION 'failing with %', code USING ERRCODE = code; END IF; RETURN 1; END $$`)
	tool := sqlTool(t, `{type: object, properties: {code: {type: string}}}`, `{statement: "SELECT fail_with(@code) AS ok", output: row}`)
	codes := []string{"40001", "40P01", "55P03", "54000", "0A000", "21000", "38001", "39004"}
	for i := range 3 * len(codes) {
		code := codes[i%len(codes)]
		_, err := runSQL(t, pool, tool, fmt.Sprintf(`{"code":%q}`, code))
		var te *tools.Error
		if !errors.As(err, &te) || te.Code != "sqlstate_"+code {
			t.Fatalf("failure %d (%s): got %v, want its SQLSTATE", i, code, err)
		}
	}
	if out, err := runSQL(t, pool, tool, `{"code":""}`); err != nil || string(out) != `{"ok":1}` {
		t.Fatalf("after %d failures: %s, %v; want the call run", 3*len(codes), out, err)
	}
	for i := 0; i < 5; i++ {
		runSQL(t, pool, tool, `{"code":"53300"}`)
	}
	if _, err := runSQL(t, pool, tool, `{"code":""}`); !errors.Is(err, tools.ErrBreakerOpen) {
		t.Fatalf("after five too_many_connections: %v, want the breaker open", err)
	}
}

// TestSQLTimeoutLeavesNothing: a statement cut off by the tool's timeout
// fails without a definite answer, and its transaction wrote nothing.
func TestSQLTimeoutLeavesNothing(t *testing.T) {
	t.Parallel()
	pool := sqlDB(t, `CREATE TABLE slow (id int)`)
	reg, err := tools.Parse([]byte(`tools:
  - name: slow
    class: transactional_write
    timeout: 200ms
    schema: {type: object}
    sql: {statement: "INSERT INTO slow SELECT 1 FROM pg_sleep(5)", output: affected}
`), "test", tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("slow")
	start := time.Now()
	_, err = runSQL(t, pool, tool, `{}`)
	outcome, _ := tools.Classify(err)
	if outcome == tools.Success || outcome == tools.Definite || time.Since(start) > 3*time.Second {
		t.Fatalf("after %s: %v (%s)", time.Since(start), err, outcome)
	}
	if n := count(t, pool, `SELECT count(*) FROM slow`); n != 0 {
		t.Fatalf("%d rows", n)
	}
}

// TestSQLRegistryErrorsNameTheField: the registry refuses, when it loads,
// a statement naming a parameter the schema does not declare, a toolq
// parameter the schema declares too, a statement that could end the
// transaction, sql on another class, another executor on a
// transactional_write, and a transactional_write without the ledger.
func TestSQLRegistryErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ tool, field, msg string }{
		{`class: transactional_write
    schema: {type: object, properties: {a: {type: string}}}
    sql: {statement: "INSERT INTO x VALUES (@a, @b)"}`, "sql.statement", "@b is neither a property the schema declares"},
		{`class: transactional_write
    schema: {type: object}
    sql: {statement: "INSERT INTO x VALUES (@a)"}`, "sql.statement", "@a is neither"},
		{`class: transactional_write
    schema: {type: object, properties: {key: {type: string}}}
    sql: {statement: "INSERT INTO x VALUES (@key)"}`, "sql.statement", "@key is toolq's"},
		{`class: transactional_write
    schema: {type: object}
    sql: {statement: "COMMIT"}`, "sql", "a COMMIT statement cannot run in the call's transaction"},
		{`class: transactional_write
    schema: {type: object}
    sql: {statement: "  -- set up\n  SET search_path = evil"}`, "sql", "a SET statement"},
		{`class: transactional_write
    schema: {type: object}
    sql: {statement: ""}`, "sql", "statement: missing"},
		{`class: transactional_write
    schema: {type: object}
    sql: {statement: "SELECT 1", output: table}`, "sql", `output: "table"`},
		{`class: keyed_write
    schema: {type: object}
    sql: {statement: "SELECT 1"}`, "sql", "only a transactional_write runs SQL"},
		{`class: transactional_write
    schema: {type: object}
    http: {url: "http://127.0.0.1:1/x"}`, "http", "give it sql, or builtin"},
		{`class: transactional_write
    schema: {type: object}
    builtin: nope`, "builtin", "no built-in transactional executor"},
		{`class: transactional_write
    ledger: false
    schema: {type: object}
    sql: {statement: "SELECT 1"}`, "ledger", "always uses the ledger"},
		{`class: transactional_write
    schema: {type: object}
    sql: {statement: "SELECT 1"}
    builtin: x`, "builtin", "a tool has one executor"},
	} {
		_, err := tools.Parse([]byte("tools:\n  - name: t\n    "+c.tool+"\n"), "reg.yaml", tools.Config{})
		var de *tools.DefinitionError
		if !errors.As(err, &de) || de.Field != c.field || !strings.Contains(de.Msg, c.msg) || de.File != "reg.yaml" || de.Tool != "t" {
			t.Errorf("%s\n  got %v (field %q), want field %q and %q", c.tool, err, fieldOf(de), c.field, c.msg)
		}
	}
}

func fieldOf(de *tools.DefinitionError) string {
	if de == nil {
		return ""
	}
	return de.Field
}

// TestTxExecutorKindMatchesTheClass: in Go, a transactional_write takes a
// TxExecutor and every other class an Executor; a registry file names a
// TxExecutor with builtin.
func TestTxExecutorKindMatchesTheClass(t *testing.T) {
	t.Parallel()
	tx := tools.TxExecutorFunc(func(context.Context, pgx.Tx, tools.Request) (json.RawMessage, error) {
		return json.RawMessage(`{}`), nil
	})
	plain := tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })
	schema := json.RawMessage(`{"type":"object"}`)
	for _, c := range []struct {
		def   tools.Definition
		field string
	}{
		{tools.Definition{Name: "a", Class: tools.TransactionalWrite, Schema: schema, Executor: plain}, "executor"},
		{tools.Definition{Name: "a", Class: tools.TransactionalWrite, Schema: schema}, "tx_executor"},
		{tools.Definition{Name: "a", Class: tools.KeyedWrite, Schema: schema, TxExecutor: tx}, "tx_executor"},
		{tools.Definition{Name: "a", Class: tools.UnkeyedWrite, Schema: schema, Executor: plain, TxExecutor: tx}, "tx_executor"},
		{tools.Definition{Name: "a", Class: tools.TransactionalWrite, Schema: schema, TxExecutor: tx}, ""},
	} {
		_, err := tools.NewRegistry([]tools.Definition{c.def}, tools.Config{})
		var de *tools.DefinitionError
		if c.field == "" && err != nil || c.field != "" && (!errors.As(err, &de) || de.Field != c.field) {
			t.Errorf("%s with executor %v, tx executor %v: %v, want field %q", c.def.Class, c.def.Executor != nil, c.def.TxExecutor != nil, err, c.field)
		}
	}
	reg, err := tools.Parse([]byte("tools:\n  - {name: t, class: transactional_write, schema: {type: object}, builtin: mine}\n"), "reg.yaml",
		tools.Config{TxBuiltins: map[string]tools.TxExecutor{"mine": tx}})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("t")
	a := tool.Audit()
	if !tool.UsesLedger || tool.ForwardsKey || a.CanDoubleFire || !strings.Contains(a.Why, "exactly once") {
		t.Fatalf("%+v, audit %+v", tool, a)
	}
	var te *tools.Error
	if _, err := tool.Run(context.Background(), tools.Request{Key: "k", Args: json.RawMessage(`{}`)}); !errors.As(err, &te) || te.Code != tools.CodeTransactional {
		t.Fatalf("Run of a transactional_write: %v", err)
	}
}

// TestSQLParamsAreThoseOfPGXNamedArgs: an @ in a literal, a quoted
// identifier, a comment or an operator is not a parameter; a name used
// twice is one parameter.
func TestSQLParamsAreThoseOfPGXNamedArgs(t *testing.T) {
	t.Parallel()
	s, err := tools.SQLExecutor(tools.SQL{Statement: `/* @c */ SELECT @a, '@b', "@d", doc @> @e::jsonb, @a -- @f
		FROM t WHERE x = $q$@g$q$ AND y = E'\'@h' AND @a_1 = 1`})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.Params(), ","); got != "a,e,a_1" {
		t.Fatalf("params %s", got)
	}
}

// TestTxExecutorCannotEndItsTransaction: Commit and Rollback of the Tx it
// is given are refused, and a statement error it swallowed is caught as a
// failed transaction. (A COMMIT statement is the ledger's to catch:
// ledger.ErrTxEnded.)
func TestTxExecutorCannotEndItsTransaction(t *testing.T) {
	t.Parallel()
	pool := sqlDB(t, `CREATE TABLE e (id int)`)
	cases := map[string]struct {
		fn   tools.TxExecutorFunc
		code string
	}{
		"commit": {func(ctx context.Context, tx pgx.Tx, _ tools.Request) (json.RawMessage, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO e VALUES (1)`); err != nil {
				return nil, err
			}
			if err := tx.Commit(ctx); err == nil {
				return nil, errors.New("Commit was allowed")
			}
			return json.RawMessage(`{}`), nil
		}, ""},
		"rollback": {func(ctx context.Context, tx pgx.Tx, _ tools.Request) (json.RawMessage, error) {
			if err := tx.Rollback(ctx); err == nil {
				return nil, errors.New("Rollback was allowed")
			}
			return json.RawMessage(`{}`), nil
		}, ""},
		"savepoint": {func(ctx context.Context, tx pgx.Tx, _ tools.Request) (json.RawMessage, error) {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return nil, err
			}
			sp.Exec(ctx, `INSERT INTO nowhere VALUES (1)`) // fails, and is rolled back to the savepoint
			if err := sp.Rollback(ctx); err != nil {
				return nil, err
			}
			return json.RawMessage(`{}`), nil
		}, ""},
		"swallowed error": {func(ctx context.Context, tx pgx.Tx, _ tools.Request) (json.RawMessage, error) {
			tx.Exec(ctx, `INSERT INTO nowhere VALUES (1)`)
			return json.RawMessage(`{}`), nil
		}, "failed_transaction"},
		"panic": {func(context.Context, pgx.Tx, tools.Request) (json.RawMessage, error) {
			panic("boom")
		}, "panic"},
	}
	for name, c := range cases {
		reg, err := tools.NewRegistry([]tools.Definition{{Name: "t", Class: tools.TransactionalWrite, Schema: json.RawMessage(`{"type":"object"}`), TxExecutor: c.fn}}, tools.Config{})
		if err != nil {
			t.Fatal(err)
		}
		tool, _ := reg.Lookup("t")
		_, err = runSQL(t, pool, tool, `{}`)
		var te *tools.Error
		switch {
		case c.code == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.code != "" && (!errors.As(err, &te) || te.Code != c.code || te.Outcome != tools.Ambiguous):
			t.Errorf("%s: %v, want ambiguous %s", name, err, c.code)
		}
	}
}
