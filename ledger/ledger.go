// Package ledger is toolq's claim store: before a write tool runs, the
// consumer claims the call's key here, and every later write about that call
// is fenced by the claim (its attempt and token), so a call takes effect once
// however often it is delivered.
//
// Store has two backends with identical semantics, checked by one conformance
// suite: Postgres (pgx, shared by any number of consumers) and SQLite (the
// embedded default, one host). Lease times come from the database's clock, so
// clock skew between consumer hosts cannot break a lease. Errors of the
// drivers never leave this package: a database that cannot be reached, or
// cannot take writes for now (a Postgres primary demoted by a failover, a
// deadlock that outlasted the retries), gives an error that wraps
// ErrUnavailable, the others wrap the sentinels below or carry only a
// message.
package ledger

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Store is the ledger on one database. Its methods are safe for concurrent
// use. Open it with Open, OpenPostgres or OpenSQLite.
type Store struct {
	db      database
	backend string
	// answeredEvery is how far Row.AnsweredAt and UpdatedAt together may
	// lag a row's last answer (answeredEvery, the default; tests shorten it).
	answeredEvery time.Duration
}

// SetAnsweredEvery sets how far a row's recorded times may lag its last
// answer: an hour by default (see Row.AnsweredAt). A shorter one records
// more answers (a write each) and lets a purge delete a row sooner after
// its retention; it is for tests of retention, which cannot wait an hour.
// Set it before the store is used.
func (s *Store) SetAnsweredEvery(d time.Duration) { s.answeredEvery = d }

// answeredEveryMS is answeredEvery in milliseconds, as the statements take it.
func (s *Store) answeredEveryMS() int64 { return cmp.Or(s.answeredEvery, answeredEvery).Milliseconds() }

// database is what a backend provides: the statements that differ between
// Postgres and SQLite, and a way to run the ones that do not.
type database interface {
	// claim claims the batch; a settled row's answer is recorded when its
	// answered_at and updated_at both lag now by more than everyMS.
	claim(ctx context.Context, claims []Claim, everyMS int64) ([]claimed, error)
	completeBatch(ctx context.Context, cs []Completion) (map[Fence]bool, error)
	// completeTx runs effect and the fenced completion of f in one
	// transaction (Store.CompleteTx): effect's error comes back as an
	// *effectError, a completion that matched no row as errNoMatch.
	completeTx(ctx context.Context, f Fence, effect TxEffect) (json.RawMessage, error)
	exec(ctx context.Context, query string, args namedArgs) (int64, error)
	queryRows(ctx context.Context, query string, args namedArgs, each func(scanner) error) error
	migrate(ctx context.Context) error
	sql() *queries
	describe(err error) (message string, unavailable bool)
	// conflicted reports a statement the database aborted to break a
	// deadlock or a serialization conflict: nothing of it was applied, and
	// run again it will most likely succeed.
	conflicted(err error) bool
	ping(ctx context.Context) error
	close()
}

type scanner interface{ Scan(dest ...any) error }

// Open opens the ledger named by databaseURL (postgres:// or postgresql://),
// or with an empty URL the SQLite file ledger.db under dataDir. It does not
// migrate: call Migrate.
func Open(ctx context.Context, databaseURL, dataDir string) (*Store, error) {
	switch {
	case databaseURL == "":
		return OpenSQLite(ctx, sqlitePath(dataDir))
	case strings.HasPrefix(databaseURL, "postgres://"), strings.HasPrefix(databaseURL, "postgresql://"):
		return OpenPostgres(ctx, databaseURL)
	case strings.HasPrefix(databaseURL, "sqlite://"), strings.HasPrefix(databaseURL, "file:"):
		return OpenSQLite(ctx, strings.TrimPrefix(strings.TrimPrefix(databaseURL, "sqlite://"), "file:"))
	default:
		return nil, fmt.Errorf("ledger: unsupported database URL %q (want postgres://… or empty for SQLite)", redact(databaseURL))
	}
}

// Backend is "postgres" or "sqlite".
func (s *Store) Backend() string { return s.backend }

// Close closes the store's connections.
func (s *Store) Close() { s.db.close() }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return s.translate("ping", s.db.ping(ctx))
}

// Migrate applies the embedded schema migrations that the database lacks. It
// is safe when several processes start at once.
func (s *Store) Migrate(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return s.translate("migrate", s.db.migrate(ctx))
}
