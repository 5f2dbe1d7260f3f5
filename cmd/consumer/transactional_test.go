package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// refundsTools is a registry file with one transactional_write.
const refundsTools = `tools:
  - name: record_refund
    class: transactional_write
    schema: {type: object, properties: {order_id: {type: string}, amount_cents: {type: integer}}, required: [order_id, amount_cents]}
    sql:
      statement: INSERT INTO refunds (order_id, amount_cents, idempotency_key) VALUES (@order_id, @amount_cents, @key) RETURNING order_id
      output: row
`

// TestTransactionalToolRunsOnPostgresOnly: the consumer refuses to start on
// the SQLite ledger with a transactional tool, naming it and saying what
// it needs; on Postgres it records the call's effect with its ledger row.
func TestTransactionalToolRunsOnPostgresOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, js := withStreams(t)
	toolsFile := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(toolsFile, []byte(refundsTools), 0o600); err != nil {
		t.Fatal(err)
	}

	_, err := runConsumer(t, map[string]string{"NATS_URL": n.URL, "TOOLQ_DATA_DIR": t.TempDir()}, "--tools", toolsFile, "--until-empty")
	if err == nil || !strings.Contains(err.Error(), `tool "record_refund" is a transactional_write`) || !strings.Contains(err.Error(), "needs the Postgres ledger") {
		t.Fatalf("on SQLite: %v", err)
	}

	dbURL := testenv.Postgres(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE refunds (order_id text, amount_cents int, idempotency_key text)`); err != nil {
		t.Fatal(err)
	}
	client := jobs.NewClient(js)
	if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "record_refund", ToolUseID: "toolu_1",
		Args: json.RawMessage(`{"amount_cents":500,"order_id":"o-1"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := runConsumer(t, map[string]string{"NATS_URL": n.URL, "DATABASE_URL": dbURL}, "--tools", toolsFile, "--until-empty"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := client.Await(wctx, "c", "toolu_1")
	if err != nil || r.Status != jobs.StatusOK || string(r.Output) != `{"order_id":"o-1"}` {
		t.Fatalf("result %+v, %v", r, err)
	}
	var refunds int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM refunds r JOIN toolq_ledger l ON l.key = r.idempotency_key AND l.state = 'completed'`).Scan(&refunds); err != nil || refunds != 1 {
		t.Fatalf("%d refunds with their completed row, %v", refunds, err)
	}
}
