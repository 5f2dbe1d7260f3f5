package ledger_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// eachBackendRaw is eachBackend with a second, plain connection to the same
// database, for a test that must make the database itself misbehave.
func eachBackendRaw(t *testing.T, body func(t *testing.T, s *ledger.Store, backend string, raw *sql.DB)) {
	t.Helper()
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var url, driver string
			var s *ledger.Store
			var err error
			switch backend {
			case "postgres":
				url, driver = testenv.Postgres(t), "pgx"
				s, err = ledger.OpenPostgres(ctx, url)
			case "sqlite":
				url, driver = filepath.Join(t.TempDir(), "ledger.db"), "sqlite"
				s, err = ledger.OpenSQLite(ctx, url)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			raw, err := sql.Open(driver, url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { raw.Close() })
			body(t, s, backend, raw)
		})
	}
}

// refuseCompletionOf makes the database refuse, with an error of its own,
// to complete the row of key.
func refuseCompletionOf(t *testing.T, backend string, raw *sql.DB, key string) {
	t.Helper()
	var stmts []string
	switch backend {
	case "postgres":
		stmts = []string{
			`CREATE FUNCTION toolq_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'refused by the test' USING ERRCODE = '22023'; END $$`,
			fmt.Sprintf(`CREATE TRIGGER toolq_test_refuse BEFORE UPDATE ON toolq_ledger FOR EACH ROW
			WHEN (NEW.key = '%s' AND NEW.state = 'completed') EXECUTE FUNCTION toolq_test_refuse()`, key),
		}
	case "sqlite":
		stmts = []string{fmt.Sprintf(`CREATE TRIGGER toolq_test_refuse BEFORE UPDATE ON toolq_ledger
			WHEN NEW.key = '%s' AND NEW.state = 'completed' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END`, key)}
	}
	for _, q := range stmts {
		if _, err := raw.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOneBadCompletionDoesNotFailTheBatch: a group commit holds a row the
// database refuses (as Postgres refuses text that is not valid UTF-8); the
// other rows of the batch complete, and only the bad one gets an error.
func TestOneBadCompletionDoesNotFailTheBatch(t *testing.T) {
	t.Parallel()
	eachBackendRaw(t, func(t *testing.T, s *ledger.Store, backend string, raw *sql.DB) {
		ctx := context.Background()
		var cs []ledger.Completion
		for range 6 {
			row := mustClaim(t, s, newClaim(time.Minute))
			cs = append(cs, ledger.Completion{Fence: row.Fence(), Output: json.RawMessage(`{"ok":true}`)})
		}
		const refused = 1
		refuseCompletionOf(t, backend, raw, cs[refused].Fence.Key)
		errs, err := s.CompleteBatch(ctx, cs)
		if err != nil {
			t.Fatalf("the batch failed as a whole: %v", err)
		}
		for i, c := range cs {
			row := mustGet(t, s, c.Fence.Key)
			switch i {
			case refused:
				if errs[i] == nil || errors.Is(errs[i], ledger.ErrUnavailable) || row.State != ledger.InFlight {
					t.Errorf("refused row %d: err %v, row %s", i, errs[i], row.State)
				}
			default:
				if errs[i] != nil || row.State != ledger.Completed || string(row.Result) != `{"ok":true}` {
					t.Errorf("innocent row %d: err %v, row %s %s", i, errs[i], row.State, row.Result)
				}
			}
		}
	})
}

// TestOutputMustBeValidUTF8JSON: an output that is not valid JSON in UTF-8
// (json.Valid accepts invalid bytes inside strings) is refused by the ledger
// itself, with ErrInvalidOutput, on both backends and before the database
// sees it; in a batch only its own row is refused.
func TestOutputMustBeValidUTF8JSON(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		for _, bad := range []string{"{\"name\":\"caf\xe9\"}", "[\"\xe2\x82\"]", `{bad`, ``} {
			row := mustClaim(t, s, newClaim(time.Minute))
			isErr(t, s.Complete(ctx, row.Fence(), json.RawMessage(bad)), ledger.ErrInvalidOutput)
			if got := mustGet(t, s, row.Key); got.State != ledger.InFlight {
				t.Fatalf("row after a refused output %q: %s", bad, got.State)
			}
		}
		var cs []ledger.Completion
		for range 4 {
			row := mustClaim(t, s, newClaim(time.Minute))
			cs = append(cs, ledger.Completion{Fence: row.Fence(), Output: json.RawMessage(`{"name":"café"}`)})
		}
		cs[2].Output = json.RawMessage("{\"name\":\"caf\xe9\"}")
		errs, err := s.CompleteBatch(ctx, cs)
		if err != nil {
			t.Fatalf("the batch failed as a whole: %v", err)
		}
		for i, c := range cs {
			row := mustGet(t, s, c.Fence.Key)
			if i == 2 {
				isErr(t, errs[i], ledger.ErrInvalidOutput)
				if row.State != ledger.InFlight {
					t.Fatalf("refused row: %s", row.State)
				}
			} else if errs[i] != nil || row.State != ledger.Completed || string(row.Result) != `{"name":"café"}` {
				t.Fatalf("row %d: err %v, %s %s", i, errs[i], row.State, row.Result)
			}
		}
		row := mustClaim(t, s, newClaim(time.Minute))
		if err := s.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset"}); err != nil {
			t.Fatal(err)
		}
		isErr(t, resolveErr(s.Resolve(ctx, row.Key, ledger.Resolution{Output: json.RawMessage("\"\xff\""), By: "op", Reason: "test"})), ledger.ErrInvalidOutput)
	})
}

// TestDuplicateClaimsWriteNothing: a batch whose keys all have rows (a
// retried turn, a replay) is answered from a read. It takes no transaction
// id, so it commits without a WAL flush: duplicates cost a round trip, not
// a disk write. With an upsert, every conflicting key was locked, and each
// batch took a transaction id.
func TestDuplicateClaimsWriteNothing(t *testing.T) {
	cluster := testenv.OwnCluster(t) // transaction ids are per cluster: no other test may take any
	url := cluster.Database(t)
	ctx := context.Background()
	s, err := ledger.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	raw, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var claims []ledger.Claim
	for i := 0; i < 10; i++ {
		c := newClaim(time.Minute)
		row := mustClaim(t, s, c)
		if i%2 == 0 { // half completed, half still in flight
			if err := s.Complete(ctx, row.Fence(), json.RawMessage(`{"ok":true}`)); err != nil {
				t.Fatal(err)
			}
		}
		c.ToolUseID, c.Owner, c.Token = fmt.Sprintf("toolu_retry_%d", i), "other", "other-token"
		claims = append(claims, c)
	}
	nextXID := func() int64 {
		var n int64
		if err := raw.QueryRow(`SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := nextXID()
	const rounds = 20
	for r := 0; r < rounds; r++ {
		res, err := s.Claim(ctx, claims)
		if err != nil {
			t.Fatal(err)
		}
		for i, got := range res {
			want := ledger.InFlight
			if i%2 == 0 {
				want = ledger.Completed
			}
			if got.Err != nil || got.Claimed || got.Row.State != want || got.Row.Key != claims[i].Key {
				t.Fatalf("round %d, claim %d: claimed=%v err=%v state=%s key=%s, want the existing %s row of %s",
					r, i, got.Claimed, got.Err, got.Row.State, got.Row.Key, want, claims[i].Key)
			}
		}
	}
	if taken := nextXID() - before; taken > 2 { // slack for the server's own background work
		t.Fatalf("%d batches of duplicates took %d transaction ids; want none", rounds, taken)
	}
}
