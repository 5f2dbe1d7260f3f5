package ledger

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestPurgeFindsOldRowsByIndex: a purge batch finds the rows it deletes
// through the index on updated_at, not by scanning the ledger: a ledger
// holds rate × retention rows, a purge deletes a day's worth in batches
// of 1,000, and each batch that scans from the table's start re-reads
// every row (and dead row) the ones before it skipped.
func TestPurgeFindsOldRowsByIndex(t *testing.T) {
	s, p := openTestStore(t, "")
	ctx := context.Background()
	if _, err := p.pool.Exec(ctx, `INSERT INTO toolq_ledger (key, conversation_id, turn_index, tool, ordinal, args_digest, state,
		attempt, owner, lease_until, first_tool_use_id, updated_at)
		SELECT 'k' || i, 'c', i, 't', 0, 'd', 'completed', 1, 'o', now(), 'tu',
			now() - (i % 40) * interval '1 day' FROM generate_series(1, 200000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.pool.Exec(ctx, `ANALYZE toolq_ledger`); err != nil {
		t.Fatal(err)
	}
	cutoff, err := s.purgeCutoff(ctx, 38*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	plan := func(q string) string {
		var lines []string
		err := p.query(ctx, "EXPLAIN "+q, []any{pgx.NamedArgs{"cutoff_ms": cutoff, "batch": 1000, "only": "", "except": "[]",
			"every_ms": s.answeredEveryMS()}}, func(sc scanner) error {
			var l string
			lines = append(lines, l)
			return sc.Scan(&lines[len(lines)-1])
		})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	now := plan(postgresQueries.purge)
	if strings.Contains(now, "Seq Scan on toolq_ledger") {
		t.Fatalf("a purge batch scans the ledger:\n%s", now)
	}
	n, err := s.Purge(ctx, 38*24*time.Hour, 1000)
	if err != nil || n == 0 {
		t.Fatalf("purged %d rows: %v", n, err)
	}
}
