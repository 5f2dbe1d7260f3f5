package worker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// withParams is a setupTx via that adds runtime parameters to the ledger's
// URL (a space written %20: pgx reads a + as itself).
func withParams(t *testing.T, params map[string]string) func(string) string {
	return func(dbURL string) string {
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		for k, v := range params {
			q.Set(k, v)
		}
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
		return u.String()
	}
}

// awaitWithin awaits the result of toolUseID for d at most, and fails
// with what the ledger holds when none comes.
func (e *txEnv) awaitWithin(t *testing.T, toolUseID, key string, d time.Duration) *jobs.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	r, err := jobs.NewClient(e.js).Await(ctx, "conv", toolUseID)
	if err != nil {
		row, _ := e.store.Get(context.Background(), key)
		t.Fatalf("%s not answered in %s (%v): row %s attempt %d failures %d, %d dead letters", toolUseID, d, err, row.State, row.Attempt, row.Failures, dlqCount(t, e.js))
	}
	return r
}

// TestTransactionalCallUnderAnyIsolationIsAnswered: whatever the ledger's
// database's default isolation, and with pgx's simple protocol as the
// connections' default, a transactional call that outlasts several
// heartbeats commits once, while others run; one whose Go executor asks
// for serializable isolation is refused for it (the transaction is read
// committed); one that breaks a deferred constraint fails with that
// constraint's SQLSTATE. Each is answered, none is dead-lettered.
func TestTransactionalCallUnderAnyIsolationIsAnswered(t *testing.T) {
	t.Parallel()
	slowGo := tools.TxExecutorFunc(func(ctx context.Context, tx pgx.Tx, r tools.Request) (json.RawMessage, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO refunds (order_id, amount_cents, idempotency_key) SELECT 'o-go', 1, $1 FROM pg_sleep(1.5)`, r.Key); err != nil {
			return nil, err
		}
		return json.RawMessage(`{"recorded":true}`), nil
	})
	isolated := tools.TxExecutorFunc(func(ctx context.Context, tx pgx.Tx, r tools.Request) (json.RawMessage, error) {
		if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`); err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO refunds (order_id, amount_cents, idempotency_key) VALUES ('o-iso', 1, $1)`, r.Key); err != nil {
			return nil, err
		}
		return json.RawMessage(`{"recorded":true}`), nil
	})
	for name, params := range map[string]map[string]string{
		"read committed":  {"default_transaction_isolation": "read committed"},
		"repeatable read": {"default_transaction_isolation": "repeatable read"},
		"serializable":    {"default_transaction_isolation": "serializable"},
		"serializable, simple protocol": {"default_transaction_isolation": "serializable",
			"default_query_exec_mode": "simple_protocol"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setupTx(t, withParams(t, params))
			if _, err := e.pool.Exec(context.Background(), `CREATE TABLE payouts (order_id text UNIQUE DEFERRABLE INITIALLY DEFERRED, idempotency_key text)`); err != nil {
				t.Fatal(err)
			}
			reg, err := tools.Parse([]byte(`tools:
  - name: slow_sql
    class: transactional_write
    timeout: 2s
    lease: 3s
    schema: {type: object, properties: {order_id: {type: string}}}
    sql:
      statement: >-
        WITH slow AS (SELECT pg_sleep(1.5))
        INSERT INTO refunds (order_id, amount_cents, idempotency_key)
        SELECT @order_id, 1, @key FROM slow RETURNING order_id
      output: row
  - name: payout
    class: transactional_write
    schema: {type: object, properties: {order_id: {type: string}, n: {type: integer}}}
    sql: {statement: "INSERT INTO payouts VALUES (@order_id, @key)", output: affected}
  - {name: slow_go, class: transactional_write, timeout: 2s, lease: 3s, schema: {type: object}, builtin: slow_go}
  - {name: isolated_go, class: transactional_write, schema: {type: object}, builtin: isolated_go}
`), "tools.yaml", tools.Config{TxBuiltins: map[string]tools.TxExecutor{"slow_go": slowGo, "isolated_go": isolated}})
			if err != nil {
				t.Fatal(err)
			}
			defer runWorker(t, e.js, e.store, reg, worker.Config{RetryDelay: 10 * time.Millisecond,
				Consumer: worker.Consumer{AckWait: time.Second, MaxDeliver: 3}})()
			call := func(tool, id, args string) string {
				return e.publish(t, &jobs.Job{ConversationID: "conv", TurnIndex: 1, Tool: tool, ToolUseID: id, Args: json.RawMessage(args)})
			}
			slowSQL := call("slow_sql", "toolu_sql", `{"order_id":"o-sql"}`)
			slowGo := call("slow_go", "toolu_go", `{}`)
			isolated := call("isolated_go", "toolu_iso", `{}`)
			first := call("payout", "toolu_payout_1", `{"n":1,"order_id":"o-1"}`)
			for id, key := range map[string]string{"toolu_sql": slowSQL, "toolu_go": slowGo} {
				if r := e.awaitWithin(t, id, key, 20*time.Second); r.Status != jobs.StatusOK || e.refunds(t, key) != 1 {
					t.Errorf("%s: result %s %s, %d refunds", id, r.Status, r.Output, e.refunds(t, key))
				}
			}
			if r := e.awaitWithin(t, "toolu_iso", isolated, 20*time.Second); r.Status != jobs.StatusError || r.Error.Code != "sqlstate_25001" || e.refunds(t, isolated) != 0 {
				t.Errorf("a Go executor that sets its isolation: result %+v, %d refunds", r, e.refunds(t, isolated))
			}
			if r := e.awaitWithin(t, "toolu_payout_1", first, 20*time.Second); r.Status != jobs.StatusOK {
				t.Errorf("first payout: %+v", r)
			}
			second := call("payout", "toolu_payout_2", `{"n":2,"order_id":"o-1"}`)
			if r := e.awaitWithin(t, "toolu_payout_2", second, 20*time.Second); r.Status != jobs.StatusError || r.Error.Code != "sqlstate_23505" {
				t.Errorf("a payout that breaks a deferred constraint: %+v", r)
			}
			if n := dlqCount(t, e.js); n != 0 {
				t.Errorf("%d dead letters", n)
			}
		})
	}
}

// TestTransactionalExecutorThatEndsItsTransactionIsLeftIndeterminate: a Go
// executor that commits the transaction it was given and then fails,
// panics, or begins another and returns output, is found once it returns:
// its call is left indeterminate after one try, never run again over what
// it committed.
func TestTransactionalExecutorThatEndsItsTransactionIsLeftIndeterminate(t *testing.T) {
	t.Parallel()
	for name, after := range map[string]func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error){
		"then fails": func(context.Context, pgx.Tx) (json.RawMessage, error) {
			return nil, tools.NotSentError("sqlstate_40001", "could not serialize access", 10*time.Millisecond, nil)
		},
		"then panics": func(context.Context, pgx.Tx) (json.RawMessage, error) {
			panic("after the commit")
		},
		"then begins another": func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
			_, err := tx.Exec(ctx, `BEGIN`)
			return json.RawMessage(`{"recorded":true}`), err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setupTx(t, nil)
			var tries atomic.Int32
			exec := tools.TxExecutorFunc(func(ctx context.Context, tx pgx.Tx, r tools.Request) (json.RawMessage, error) {
				tries.Add(1)
				if _, err := tx.Exec(ctx, `INSERT INTO refunds (order_id, amount_cents, idempotency_key) VALUES ('o-1', 1, $1)`, r.Key); err != nil {
					return nil, err
				}
				if _, err := tx.Exec(ctx, `COMMIT`); err != nil {
					return nil, err
				}
				return after(ctx, tx)
			})
			reg, err := tools.NewRegistry([]tools.Definition{{Name: "record_refund", Class: tools.TransactionalWrite,
				Schema: json.RawMessage(`{"type":"object"}`), TxExecutor: exec}}, tools.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer runWorker(t, e.js, e.store, reg, worker.Config{RetryDelay: 10 * time.Millisecond})()
			key := e.publish(t, refundJob("toolu_1", `{}`))
			r := e.await(t, "toolu_1")
			row, _ := e.store.Get(context.Background(), key)
			if r.Status != jobs.StatusIndeterminate || r.Error == nil || r.Error.Code != tools.CodeTxEnded || row.State != ledger.Indeterminate ||
				tries.Load() != 1 || e.refunds(t, key) != 1 {
				t.Fatalf("result %s %+v after %d tries, row %s, %d refunds", r.Status, r.Error, tries.Load(), row.State, e.refunds(t, key))
			}
		})
	}
}

// TestTransactionalSQLRefusesANumberItWouldNotBindAsWritten: the worker
// binds the canonical args, whose numbers are doubles: 1 ETH and 1 wei,
// 1.000000000000000001, would be bound as 1. Such a call is rejected
// before it is claimed, saying to send the number as a string, which a
// numeric column takes exactly.
func TestTransactionalSQLRefusesANumberItWouldNotBindAsWritten(t *testing.T) {
	t.Parallel()
	e := setupTx(t, nil)
	if _, err := e.pool.Exec(context.Background(), `CREATE TABLE payouts (amount numeric(38,18) NOT NULL, idempotency_key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	reg, err := tools.Parse([]byte(`tools:
  - name: record_refund
    class: transactional_write
    schema: {type: object, properties: {amount: {type: [number, string]}}, required: [amount]}
    sql:
      statement: INSERT INTO payouts (amount, idempotency_key) VALUES (@amount, @key) RETURNING amount::text AS amount
      output: row
`), "payouts.yaml", tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer runWorker(t, e.js, e.store, reg, worker.Config{})()
	rounded := e.publish(t, refundJob("toolu_1", `{"amount":1.000000000000000001}`))
	r := e.await(t, "toolu_1")
	if r.Status != jobs.StatusRejected || r.Error == nil || r.Error.Code != "invalid_args" || !strings.Contains(r.Error.Message, "send it as a string") {
		t.Fatalf("a number bound as another: %+v", r)
	}
	if _, err := e.store.Get(context.Background(), rounded); err == nil {
		t.Fatal("a rejected call was claimed")
	}
	e.publish(t, refundJob("toolu_2", `{"amount":"1.000000000000000001"}`))
	if r := e.await(t, "toolu_2"); r.Status != jobs.StatusOK || string(r.Output) != `{"amount":"1.000000000000000001"}` {
		t.Fatalf("the number as a string: %s %s", r.Status, r.Output)
	}
	e.publish(t, refundJob("toolu_3", `{"amount":0.1}`))
	if r := e.await(t, "toolu_3"); r.Status != jobs.StatusOK || string(r.Output) != `{"amount":"0.100000000000000000"}` {
		t.Fatalf("a number that is its double: %s %s", r.Status, r.Output)
	}
}

// TestTransactionalSQLLeavesNoSessionStateOnTheLedgersConnections: an
// allowed statement kind (SELECT) takes a session-level advisory lock; it
// does not outlive the call on the pooled ledger connection.
func TestTransactionalSQLLeavesNoSessionStateOnTheLedgersConnections(t *testing.T) {
	t.Parallel()
	e := setupTx(t, nil)
	reg, err := tools.Parse([]byte(`tools:
  - name: record_refund
    class: transactional_write
    schema: {type: object, properties: {order_id: {type: string}}}
    sql:
      statement: SELECT pg_advisory_lock(hashtext(@order_id))::text AS locked
      output: row
`), "locks.yaml", tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer runWorker(t, e.js, e.store, reg, worker.Config{})()
	key := e.publish(t, refundJob("toolu_1", `{"order_id":"o-1"}`))
	r := e.await(t, "toolu_1")
	row, _ := e.store.Get(context.Background(), key)
	var held int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 || row.State != ledger.Completed {
		t.Fatalf("after the call (%s, row %s) the ledger's pool still holds %d advisory locks", r.Status, row.State, held)
	}
}

// TestTransactionalPoisonArgsDoNotHoldBackOtherCalls: a call whose args
// make the statement fail the same way every time, with an SQLSTATE of no
// class the earlier table named (54000: an order_id too long for its btree
// index), is a definite failure, answered at once; it does not count
// against the tool's breaker, and the tool's other calls go through.
func TestTransactionalPoisonArgsDoNotHoldBackOtherCalls(t *testing.T) {
	t.Parallel()
	e := setupTx(t, nil)
	if _, err := e.pool.Exec(context.Background(), `CREATE INDEX ON refunds (order_id)`); err != nil {
		t.Fatal(err)
	}
	reg := refundRegistry(t, tools.Config{})
	defer runWorker(t, e.js, e.store, reg, worker.Config{RetryDelay: 10 * time.Millisecond})()
	var long []byte
	for sum := sha256.Sum256(nil); len(long) < 8000; sum = sha256.Sum256(sum[:]) {
		long = hex.AppendEncode(long, sum[:])
	}
	for i := range 6 {
		id := "toolu_poison_" + string(rune('a'+i))
		key := e.publish(t, refundJob(id, `{"amount_cents":`+string(rune('1'+i))+`,"order_id":"`+string(long)+`"}`))
		r := e.await(t, id)
		row, _ := e.store.Get(context.Background(), key)
		if r.Status != jobs.StatusError || r.Error == nil || r.Error.Code != "sqlstate_54000" || row.State != ledger.Failed || row.Failures != 0 {
			t.Fatalf("poison call %d: result %+v, row %s after %d failures", i, r, row.State, row.Failures)
		}
	}
	e.publish(t, refundJob("toolu_good", `{"amount_cents":500,"order_id":"o-1"}`))
	tool, _ := reg.Lookup("record_refund")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := jobs.NewClient(e.js).Await(ctx, "conv", "toolu_good"); err != nil || r.Status != jobs.StatusOK {
		t.Fatalf("a good call after six bad ones (breaker open for %v): %+v, %v", tool.BreakerWait(), r, err)
	}
}

// TestTransactionalDeferredConstraintIsADefiniteFailure: a deferrable
// constraint is checked when the call's effect ends, not at the commit
// that completes it: its violation is the call's definite failure, with
// its SQLSTATE, recorded failed, instead of a commit refused at every try
// and a dead letter.
func TestTransactionalDeferredConstraintIsADefiniteFailure(t *testing.T) {
	t.Parallel()
	e := setupTx(t, nil)
	if _, err := e.pool.Exec(context.Background(),
		`ALTER TABLE refunds ADD CONSTRAINT one_refund_per_order UNIQUE (order_id) DEFERRABLE INITIALLY DEFERRED`); err != nil {
		t.Fatal(err)
	}
	defer runWorker(t, e.js, e.store, refundRegistry(t, tools.Config{}), worker.Config{RetryDelay: 10 * time.Millisecond,
		Consumer: worker.Consumer{MaxDeliver: 3}})()
	e.publish(t, refundJob("toolu_1", `{"amount_cents":500,"order_id":"o-1"}`))
	if r := e.await(t, "toolu_1"); r.Status != jobs.StatusOK {
		t.Fatalf("first: %+v", r)
	}
	key := e.publish(t, refundJob("toolu_2", `{"amount_cents":600,"order_id":"o-1"}`))
	r := e.awaitWithin(t, "toolu_2", key, 10*time.Second)
	row, _ := e.store.Get(context.Background(), key)
	if r.Status != jobs.StatusError || r.Error == nil || r.Error.Code != "sqlstate_23505" || row.State != ledger.Failed || e.refunds(t, key) != 0 {
		t.Fatalf("second: result %+v; row %s attempt %d; %d refunds", r, row.State, row.Attempt, e.refunds(t, key))
	}
}
