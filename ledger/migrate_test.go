package ledger_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", to lay out an old schema by hand

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// TestUpgradeKeepsExistingRows: a ledger made by the first schema, with an
// in-flight and a completed row, is migrated; both rows keep working, and
// the in-flight one, released, is claimed again at its next attempt.
func TestUpgradeKeepsExistingRows(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			first, err := os.ReadFile(filepath.Join("migrations", backend, "0001_ledger.sql"))
			if err != nil {
				t.Fatal(err)
			}
			var url, driver string
			var stmts []string
			switch backend {
			case "postgres":
				url, driver = testenv.Postgres(t), "pgx"
				stmts = []string{string(first),
					`CREATE TABLE toolq_schema_migrations (version bigint PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
					`INSERT INTO toolq_ledger (key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner, lease_until, first_tool_use_id)
						VALUES ('old-busy', 'conv-1', 1, 'send_payment', 0, 'digest', 'in_flight', 3, 'old', now() + interval '1 hour', 'toolu_1')`,
					`INSERT INTO toolq_ledger (key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner, lease_until, first_tool_use_id, result)
						VALUES ('old-done', 'conv-1', 2, 'send_payment', 0, 'digest', 'completed', 1, 'old', now(), 'toolu_2', '{"id":"pay_1"}')`,
				}
			case "sqlite":
				url, driver = filepath.Join(t.TempDir(), "ledger.db"), "sqlite"
				now := time.Now().UnixMilli()
				stmts = []string{string(first),
					`CREATE TABLE toolq_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL DEFAULT 0)`,
					`INSERT INTO toolq_ledger (key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner, lease_until, first_tool_use_id, created_at, updated_at)
						VALUES ('old-busy', 'conv-1', 1, 'send_payment', 0, 'digest', 'in_flight', 3, 'old', ` + itoa(now+3600_000) + `, 'toolu_1', ` + itoa(now) + `, ` + itoa(now) + `)`,
					`INSERT INTO toolq_ledger (key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner, lease_until, first_tool_use_id, result, created_at, updated_at)
						VALUES ('old-done', 'conv-1', 2, 'send_payment', 0, 'digest', 'completed', 1, 'old', ` + itoa(now) + `, 'toolu_2', '{"id":"pay_1"}', ` + itoa(now) + `, ` + itoa(now) + `)`,
				}
			}
			stmts = append(stmts, `INSERT INTO toolq_schema_migrations (version, name) VALUES (1, 'ledger')`)
			db, err := sql.Open(driver, url)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range stmts {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			db.Close()

			s, err := ledger.Open(ctx, map[string]string{"postgres": url, "sqlite": "sqlite://" + url}[backend], "")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if done := mustGet(t, s, "old-done"); done.State != ledger.Completed || string(done.Result) != `{"id":"pay_1"}` {
				t.Fatalf("completed row after the upgrade: %+v", done)
			}
			busy := mustGet(t, s, "old-busy")
			if busy.State != ledger.InFlight || busy.Attempt != 3 {
				t.Fatalf("in-flight row after the upgrade: %+v", busy)
			}
			if err := s.Release(ctx, busy.Fence()); err != nil {
				t.Fatal(err)
			}
			c := ledger.Claim{Key: "old-busy", ConversationID: "conv-1", TurnIndex: 1, Tool: "send_payment", ArgsDigest: "digest",
				ToolUseID: "toolu_3", Owner: "new", Lease: time.Minute}
			again := mustClaim(t, s, c)
			if again.Attempt != 4 {
				t.Fatalf("claim after releasing an upgraded row: attempt %d, want 4", again.Attempt)
			}
			if err := s.Complete(ctx, again.Fence(), json.RawMessage(`{}`)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
