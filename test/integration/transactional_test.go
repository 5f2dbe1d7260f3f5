package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/worker"
)

// refundToolYAML is a transactional_write that records a refund in the
// ledger's database (options.transactional). Its table has no unique key:
// one refund per call is the transaction's doing alone. The statement
// takes a little while, so that a kill finds transactions open.
const refundToolYAML = `  - name: record_refund
    class: transactional_write
    timeout: 1500ms
    lease: 2s
    breaker: {failures: 1000}
    schema:
      type: object
      additionalProperties: false
      required: [order_id, amount_cents]
      properties:
        order_id: {type: string}
        amount_cents: {type: integer}
    sql:
      statement: >-
        INSERT INTO refunds (order_id, amount_cents, idempotency_key)
        SELECT @order_id::text, @amount_cents::int, @key::text FROM pg_sleep(0.02) RETURNING order_id, amount_cents
      output: row
`

// createRefunds creates record_refund's table in the ledger's database.
func createRefunds(t *testing.T, dbURL string) {
	t.Helper()
	if dbURL == "" {
		t.Fatal("record_refund needs the Postgres ledger")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE refunds (id bigserial PRIMARY KEY, order_id text NOT NULL,
		amount_cents int NOT NULL, idempotency_key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// checkRefunds checks that the refunds and the ledger rows of record_refund
// are never apart: every refund has its completed row, every row is
// completed (none indeterminate, none left in flight) and has exactly one
// refund; and that there are calls of them.
func (e *env) checkRefunds(calls int) {
	e.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, e.dbURL)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close(ctx)
	for what, query := range map[string]string{
		"refunds without a completed ledger row": `SELECT count(*) FROM refunds r WHERE NOT EXISTS
			(SELECT 1 FROM toolq_ledger l WHERE l.key = r.idempotency_key AND l.state = 'completed')`,
		"ledger rows not completed": `SELECT count(*) FROM toolq_ledger WHERE tool = 'record_refund' AND state <> 'completed'`,
		"completed rows without exactly one refund": `SELECT count(*) FROM toolq_ledger l WHERE l.tool = 'record_refund'
			AND (SELECT count(*) FROM refunds r WHERE r.idempotency_key = l.key) <> 1`,
	} {
		var n int
		if err := conn.QueryRow(ctx, query).Scan(&n); err != nil {
			e.t.Fatal(err)
		}
		if n != 0 {
			e.t.Errorf("%d %s\nlogs:\n%s", n, what, e.logs.String())
		}
	}
	var refunds, rows int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM refunds), (SELECT count(*) FROM toolq_ledger WHERE tool = 'record_refund')`).Scan(&refunds, &rows); err != nil {
		e.t.Fatal(err)
	}
	if refunds != calls || rows != calls {
		e.t.Errorf("%d refunds and %d ledger rows for %d calls", refunds, rows, calls)
	}
}

// refundJobs are calls of record_refund in conversation conv, each
// published twice (a retried turn: another tool_use_id, the same key).
func refundJobs(conv string, calls int) (originals, duplicates []*jobs.Job) {
	for i := range calls {
		args := fmt.Sprintf(`{"amount_cents":%d,"order_id":"o-%d"}`, 100+i, i)
		originals = append(originals, job(conv, 0, "record_refund", args))
		duplicates = append(duplicates, job(conv, 0, "record_refund", args))
	}
	return originals, duplicates
}

// TestKilledTransactionalWorker kills a real worker process with SIGKILL at
// each point between claim and ack while it records refunds, one of them
// in the middle of its transaction (DuringTool: the refund is written, not
// committed), then lets another worker finish. Every call takes effect
// exactly once, its refund and its ledger row never apart, and none is
// indeterminate.
func TestKilledTransactionalWorker(t *testing.T) {
	t.Parallel()
	for _, point := range []worker.FaultPoint{worker.AfterClaim, worker.DuringTool, worker.AfterComplete, worker.AfterPublish, worker.BeforeAck} {
		t.Run(string(point), func(t *testing.T) {
			t.Parallel()
			o := options{ackWait: time.Second, transactional: true}
			e := setup(t, o)
			h := e.startHelper(helperSpec{KillAt: string(point), KillTool: "record_refund", AckWaitMS: 1000, Transactional: true})
			originals, duplicates := refundJobs(conv(t), 5)
			for i := range originals {
				e.publish(originals[i])
				e.publish(duplicates[i])
			}
			last, err := h.wait(t, 30*time.Second)
			if last != "killed at "+string(point) || err == nil || !strings.Contains(err.Error(), "killed") {
				t.Fatalf("helper ended with %q, %v\n%s", last, err, e.logs.String())
			}
			e.startWorker(o, nil)
			for i := range originals {
				r, dup := e.await(originals[i]), e.await(duplicates[i])
				if r.Status != jobs.StatusOK || dup.Status != jobs.StatusOK || string(r.Output) != string(dup.Output) {
					t.Fatalf("call %d: %+v and its duplicate %+v", i, r, dup)
				}
			}
			e.settled()
			e.checkRefunds(len(originals))
		})
	}
}

// TestSIGKILLDuringTransactions kills a worker process that is recording
// refunds as fast as it can, at whatever point it has reached: claims,
// open transactions, commits in flight, results unpublished. Another worker
// finishes the calls: each refund exactly once, and never apart from its
// ledger row.
func TestSIGKILLDuringTransactions(t *testing.T) {
	t.Parallel()
	o := options{ackWait: time.Second, transactional: true}
	e := setup(t, o)
	h := e.startHelper(helperSpec{AckWaitMS: 1000, Transactional: true})
	originals, duplicates := refundJobs(conv(t), 40)
	for i := range originals {
		e.publish(originals[i])
		e.publish(duplicates[i])
	}
	conn, err := pgx.Connect(context.Background(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	testenv.Eventually(t, 30*time.Second, "the first refunds", func() bool {
		var n int
		return conn.QueryRow(context.Background(), `SELECT count(*) FROM refunds`).Scan(&n) == nil && n >= 5
	})
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := h.wait(t, 30*time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("helper ended with %v", err)
	}
	e.startWorker(o, nil)
	for i := range originals {
		r, dup := e.await(originals[i]), e.await(duplicates[i])
		if r.Status != jobs.StatusOK || dup.Status != jobs.StatusOK || string(r.Output) != string(dup.Output) {
			t.Fatalf("call %d: %+v and its duplicate %+v", i, r, dup)
		}
	}
	e.settled()
	e.checkRefunds(len(originals))
}
