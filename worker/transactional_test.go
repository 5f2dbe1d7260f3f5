package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// refundsYAML is a transactional tool: a refund recorded in the ledger's
// database. The table has no unique key: one effect per call is the
// transaction's doing alone.
const refundsYAML = `tools:
  - name: record_refund
    class: transactional_write
    timeout: 2s
    lease: 3s
    schema: {type: object, properties: {order_id: {type: string}, amount_cents: {type: integer}}, required: [order_id, amount_cents]}
    sql:
      statement: INSERT INTO refunds (order_id, amount_cents, idempotency_key) VALUES (@order_id, @amount_cents, @key) RETURNING order_id, amount_cents
      output: row
`

const refundsTable = `CREATE TABLE refunds (id bigserial PRIMARY KEY, order_id text NOT NULL,
	amount_cents int NOT NULL CHECK (amount_cents > 0), idempotency_key text NOT NULL)`

// txEnv is a broker and a Postgres ledger whose database holds the refunds
// table; via, when set, rewrites the URL the ledger connects to.
type txEnv struct {
	js    jetstream.JetStream
	store *ledger.Store
	pool  *pgxpool.Pool // the same database, directly
}

func setupTx(t *testing.T, via func(string) string) *txEnv {
	t.Helper()
	ctx := context.Background()
	dbURL := testenv.Postgres(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, refundsTable); err != nil {
		t.Fatal(err)
	}
	store, err := ledger.OpenPostgres(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if via != nil { // migrated directly: nothing but the worker's own statements through via
		if store, err = ledger.OpenPostgres(ctx, via(dbURL)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(store.Close)
	}
	js, err := jetstream.New(testenv.StartNATS(t).Connect())
	if err != nil {
		t.Fatal(err)
	}
	return &txEnv{js: js, store: store, pool: pool}
}

func refundRegistry(t *testing.T, cfg tools.Config) *tools.Registry {
	t.Helper()
	reg, err := tools.Parse([]byte(refundsYAML), "refunds.yaml", cfg)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func (e *txEnv) refunds(t *testing.T, key string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM refunds WHERE idempotency_key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func refundJob(toolUseID, args string) *jobs.Job {
	return &jobs.Job{ConversationID: "conv", TurnIndex: 1, Tool: "record_refund", ToolUseID: toolUseID, Args: json.RawMessage(args)}
}

func (e *txEnv) publish(t *testing.T, j *jobs.Job) string {
	t.Helper()
	if _, err := jobs.NewClient(e.js).Publish(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	key, err := j.Call().Key()
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func (e *txEnv) await(t *testing.T, toolUseID string) *jobs.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := jobs.NewClient(e.js).Await(ctx, "conv", toolUseID)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestTransactionalWriteTakesEffectOnce: a call, its duplicate under
// another tool_use_id and its redelivery make one refund, and every answer
// is the committed row's.
func TestTransactionalWriteTakesEffectOnce(t *testing.T) {
	t.Parallel()
	e := setupTx(t, nil)
	defer runWorker(t, e.js, e.store, refundRegistry(t, tools.Config{}), worker.Config{})()
	args := `{"amount_cents":500,"order_id":"o-1"}`
	key := e.publish(t, refundJob("toolu_1", args))
	first := e.await(t, "toolu_1")
	e.publish(t, refundJob("toolu_2", args))
	e.publish(t, refundJob("toolu_1", args))
	second := e.await(t, "toolu_2")
	if first.Status != jobs.StatusOK || string(first.Output) != `{"order_id":"o-1","amount_cents":500}` {
		t.Fatalf("first: %+v", first)
	}
	if !second.Duplicate || string(second.Output) != string(first.Output) {
		t.Fatalf("duplicate: %+v", second)
	}
	row, err := e.store.Get(context.Background(), key)
	if err != nil || row.State != ledger.Completed || string(row.Result) != string(first.Output) || e.refunds(t, key) != 1 {
		t.Fatalf("row %+v (%v), %d refunds", row, err, e.refunds(t, key))
	}
}

// TestTransactionalWriteRefusedIsFailedWithNoEffect: a statement the
// database refuses (a check constraint) is the call's definite answer, and
// nothing of it remains.
func TestTransactionalWriteRefusedIsFailedWithNoEffect(t *testing.T) {
	t.Parallel()
	e := setupTx(t, nil)
	defer runWorker(t, e.js, e.store, refundRegistry(t, tools.Config{}), worker.Config{})()
	key := e.publish(t, refundJob("toolu_1", `{"amount_cents":-5,"order_id":"o-1"}`))
	r := e.await(t, "toolu_1")
	if r.Status != jobs.StatusError || r.Error == nil || r.Error.Code != "sqlstate_23514" {
		t.Fatalf("result %+v", r)
	}
	row, err := e.store.Get(context.Background(), key)
	if err != nil || row.State != ledger.Failed || e.refunds(t, key) != 0 {
		t.Fatalf("row %+v (%v), %d refunds", row, err, e.refunds(t, key))
	}
}

// TestTransactionalWriteRunsAgainWhatDidNotCommit: a try that wrote, then
// failed without a definite answer (a deadlock, say), rolled back: the
// call runs again and makes one refund.
func TestTransactionalWriteRunsAgainWhatDidNotCommit(t *testing.T) {
	t.Parallel()
	e := setupTx(t, nil)
	var tries atomic.Int32
	flaky := tools.TxExecutorFunc(func(ctx context.Context, tx pgx.Tx, r tools.Request) (json.RawMessage, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO refunds (order_id, amount_cents, idempotency_key) VALUES ('o-1', 1, $1)`, r.Key); err != nil {
			return nil, err
		}
		if tries.Add(1) == 1 {
			return nil, tools.NotSentError("sqlstate_40P01", "deadlock detected", 10*time.Millisecond, nil)
		}
		return json.RawMessage(`{"recorded":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "record_refund", Class: tools.TransactionalWrite,
		Schema: json.RawMessage(`{"type":"object"}`), TxExecutor: flaky}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer runWorker(t, e.js, e.store, reg, worker.Config{RetryDelay: 10 * time.Millisecond})()
	key := e.publish(t, refundJob("toolu_1", `{}`))
	if r := e.await(t, "toolu_1"); r.Status != jobs.StatusOK || tries.Load() != 2 || e.refunds(t, key) != 1 {
		t.Fatalf("result %+v after %d tries, %d refunds", r, tries.Load(), e.refunds(t, key))
	}
}

// TestTransactionalWriteWhoseHolderDiedRunsAgain: a worker that stops in
// the middle of the transaction (it never commits) is taken over once its
// lease runs out, and the call runs again: one refund, never an
// indeterminate result.
func TestTransactionalWriteWhoseHolderDiedRunsAgain(t *testing.T) {
	t.Parallel()
	e := setupTx(t, nil)
	reg := refundRegistry(t, tools.Config{})
	consumer := worker.Consumer{AckWait: time.Second}
	died, hang := make(chan struct{}), make(chan struct{})
	stop1 := runWorker(t, e.js, e.store, reg, worker.Config{Owner: "pod-0", Consumer: consumer, ShutdownTimeout: 50 * time.Millisecond,
		Test: worker.TestConfig{Hook: func(p worker.FaultPoint, j *jobs.Job) {
			if p == worker.DuringTool {
				close(died)
				<-hang // the refund is written in its transaction, which never commits
			}
		}}})
	key := e.publish(t, refundJob("toolu_1", `{"amount_cents":500,"order_id":"o-1"}`))
	select {
	case <-died:
	case <-time.After(10 * time.Second):
		t.Fatal("the first worker never ran the call")
	}
	stop1()
	defer close(hang)
	stop2 := runWorker(t, e.js, e.store, reg, worker.Config{Owner: "pod-1", Consumer: consumer})
	defer stop2()
	r := e.await(t, "toolu_1")
	row, err := e.store.Get(context.Background(), key)
	if r.Status != jobs.StatusOK || err != nil || row.State != ledger.Completed || row.Attempt != 2 || row.Owner != "pod-1" || e.refunds(t, key) != 1 {
		t.Fatalf("result %+v, row %+v (%v), %d refunds", r, row, err, e.refunds(t, key))
	}
}

// TestTransactionalCommitWhoseAnswerIsLost: the connection to the ledger
// breaks after COMMIT was sent; the worker learns from the row that the
// transaction committed and answers with its result.
func TestTransactionalCommitWhoseAnswerIsLost(t *testing.T) {
	t.Parallel()
	var proxy *testenv.CutProxy
	e := setupTx(t, func(dbURL string) string {
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		proxy = testenv.StartCutProxy(t, u.Host)
		u.Host = proxy.Addr()
		return u.String()
	})
	logs := &testenv.Buffer{}
	defer runWorker(t, e.js, e.store, refundRegistry(t, tools.Config{}), worker.Config{RetryDelay: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})()
	proxy.CutResponse("COMMIT\x00") // the completion's commit, a simple query
	key := e.publish(t, refundJob("toolu_1", `{"amount_cents":500,"order_id":"o-1"}`))
	r := e.await(t, "toolu_1")
	if r.Status != jobs.StatusOK || string(r.Output) != `{"order_id":"o-1","amount_cents":500}` || proxy.Cuts() != 1 || e.refunds(t, key) != 1 {
		t.Fatalf("result %+v after %d cuts, %d refunds", r, proxy.Cuts(), e.refunds(t, key))
	}
	if !strings.Contains(logs.String(), "the transaction had committed before the answer to its commit was lost") {
		t.Fatalf("not answered by the delivery that committed:\n%s", logs.String())
	}
}

// TestTransactionalWriteNeedsPostgres: a worker on the SQLite ledger
// refuses a registry with a transactional tool, and says why.
func TestTransactionalWriteNeedsPostgres(t *testing.T) {
	t.Parallel()
	js, store := sharedEnv(t)
	_, err := worker.New(context.Background(), worker.Config{JS: js, Ledger: store, Tools: refundRegistry(t, tools.Config{})})
	if err == nil || !strings.Contains(err.Error(), `tool "record_refund" is a transactional_write`) ||
		!strings.Contains(err.Error(), "needs the Postgres ledger, and this one is sqlite") {
		t.Fatalf("err = %v", err)
	}
	if errors.Is(err, ledger.ErrUnavailable) {
		t.Fatal("a configuration error reads as an outage")
	}
}
