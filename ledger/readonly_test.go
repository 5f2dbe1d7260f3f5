package ledger_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// TestReadOnlyPrimaryIsAnOutage: a Postgres primary demoted after a failover
// answers writes with SQLSTATE 25006 (read_only_sql_transaction). That is an
// outage the worker waits out, not a verdict on the call: the error wraps
// ErrUnavailable, and writes pass again once the database takes them.
func TestReadOnlyPrimaryIsAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.Postgres(t)
	open := func() *ledger.Store {
		s, err := ledger.OpenPostgres(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	rw := open()
	if err := rw.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	row := mustClaim(t, rw, newClaim(time.Minute))
	raw, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var name string
	if err := raw.QueryRow(`SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	setReadOnly := func(on bool) {
		q := `ALTER DATABASE ` + pgx.Identifier{name}.Sanitize() + ` RESET default_transaction_read_only`
		if on {
			q = `ALTER DATABASE ` + pgx.Identifier{name}.Sanitize() + ` SET default_transaction_read_only = on`
		}
		if _, err := raw.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	setReadOnly(true)
	ro := open() // new sessions start read-only
	if _, err := ro.Claim(ctx, []ledger.Claim{newClaim(time.Minute)}); !errors.Is(err, ledger.ErrUnavailable) {
		t.Errorf("claim on a read-only database: %v, want ErrUnavailable", err)
	}
	if err := ro.Complete(ctx, row.Fence(), json.RawMessage(`{}`)); !errors.Is(err, ledger.ErrUnavailable) {
		t.Errorf("complete on a read-only database: %v, want ErrUnavailable", err)
	}
	if _, err := ro.CompleteBatch(ctx, []ledger.Completion{{Fence: row.Fence(), Output: json.RawMessage(`{}`)}}); !errors.Is(err, ledger.ErrUnavailable) {
		t.Errorf("batch complete on a read-only database: %v, want ErrUnavailable", err)
	}
	if got := mustGet(t, ro, row.Key); got.State != ledger.InFlight {
		t.Fatalf("row on a read-only database: %+v", got)
	}
	// The failover ends: the same store writes again once it retries, as the
	// worker does, on sessions opened since (not on the read-only ones it
	// holds, which would last as long as the pool keeps them).
	setReadOnly(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := ro.Complete(ctx, row.Fence(), json.RawMessage(`{}`))
		if err == nil {
			break
		}
		if !errors.Is(err, ledger.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("complete once the database takes writes again: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
