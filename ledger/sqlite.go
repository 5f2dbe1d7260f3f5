package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

var claimSQLite = `INSERT INTO toolq_ledger (key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner,
	lease_until, first_tool_use_id, trace_id, span_id, claim_token, created_at, updated_at, tenant)
	VALUES ($1, $2, $3, $4, $5, $6, 'in_flight', 1, $7, ((` + sqliteNow + `) + $8), $9, $10, $11, $12, (` + sqliteNow + `), (` + sqliteNow + `), $13)
	` + claimConflict + ` RETURNING ` + sqliteCols

type sqliteDB struct {
	db *sql.DB
}

func sqlitePath(dataDir string) string {
	if dataDir == "" {
		dataDir = "."
	}
	return filepath.Join(dataDir, "ledger.db")
}

// OpenSQLite opens (creating it if needed) the SQLite ledger at path, in WAL
// mode with synchronous=FULL (a completed row survives a power cut) and a
// busy timeout, so that several connections, and processes, share it.
func OpenSQLite(ctx context.Context, path string) (*Store, error) {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("ledger: %w", err)
		}
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Set("_txlock", "immediate") // a transaction takes the write lock up front: no upgrade deadlocks
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("ledger: open %s: %s", path, err)
	}
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	s := &Store{db: &sqliteDB{db: db}, backend: "sqlite"}
	// The first connection switches the file to WAL, which SQLite may refuse
	// with SQLITE_BUSY, without waiting, while another process opens it too.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.Ping(ctx)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, ErrUnavailable) || time.Now().After(deadline) || ctx.Err() != nil {
			db.Close()
			return nil, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *sqliteDB) sql() *queries { return sqliteQueries }

func (s *sqliteDB) ping(ctx context.Context) error { return s.db.PingContext(ctx) }

func (s *sqliteDB) close() { s.db.Close() }

func (s *sqliteDB) exec(ctx context.Context, query string, args namedArgs) (int64, error) {
	res, err := s.db.ExecContext(ctx, query, sqliteArgs(args)...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// sqliteArgs are named arguments as database/sql takes them (@name in the
// statement).
func sqliteArgs(args namedArgs) []any {
	out := make([]any, 0, len(args))
	for k, v := range args {
		out = append(out, sql.Named(k, v))
	}
	return out
}

func (s *sqliteDB) queryRows(ctx context.Context, query string, args namedArgs, each func(scanner) error) error {
	rows, err := s.db.QueryContext(ctx, query, sqliteArgs(args)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// claim runs the batch in one immediate transaction: one write lock, one
// fsync, however many keys. A key whose row is settled answers a duplicate:
// the answer is recorded at most once an hour a row (see answeredEvery; a
// transaction that changed nothing commits without an fsync).
func (s *sqliteDB) claim(ctx context.Context, claims []Claim, everyMS int64) ([]claimed, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	ins, err := tx.PrepareContext(ctx, claimSQLite)
	if err != nil {
		return nil, err
	}
	defer ins.Close()
	get, err := tx.PrepareContext(ctx, sqliteQueries.get)
	if err != nil {
		return nil, err
	}
	defer get.Close()
	answered, err := tx.PrepareContext(ctx, sqliteQueries.answered)
	if err != nil {
		return nil, err
	}
	defer answered.Close()
	out := make([]claimed, len(claims))
	for i := range claims {
		c := &claims[i]
		err := scanRow(ins.QueryRowContext(ctx, c.Key, c.ConversationID, c.TurnIndex, c.Tool, c.Ordinal, c.ArgsDigest,
			c.Owner, c.Lease.Milliseconds(), c.ToolUseID, c.TraceID, c.SpanID, c.Token, c.Tenant), &out[i].row)
		switch {
		case err == nil:
			out[i].inserted = true
		case errors.Is(err, sql.ErrNoRows):
			if err := scanRow(get.QueryRowContext(ctx, sql.Named("key", c.Key)), &out[i].row); err != nil {
				return nil, err
			}
			if out[i].row.State != InFlight {
				if _, err := answered.ExecContext(ctx, sql.Named("key", c.Key), sql.Named("every_ms", everyMS)); err != nil {
					return nil, err
				}
			}
		default:
			return nil, err
		}
	}
	return out, tx.Commit()
}

func (s *sqliteDB) completeBatch(ctx context.Context, cs []Completion) (map[Fence]bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, sqliteQueries.complete)
	if err != nil {
		return nil, err
	}
	defer stmt.Close()
	done := make(map[Fence]bool, len(cs))
	for _, c := range cs {
		res, err := stmt.ExecContext(ctx, sqliteArgs(fenceArgs(c.Fence, namedArgs{"result": string(c.Output)}))...)
		if err != nil {
			return nil, err
		}
		if n, _ := res.RowsAffected(); n == 1 {
			done[c.Fence] = true
		}
	}
	return done, tx.Commit()
}

func (s *sqliteDB) migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil) // immediate: holds the write lock, so one migrator at a time
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := applyMigrations(ctx, "sqlite", sqlTx{tx},
		`CREATE TABLE IF NOT EXISTS toolq_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL DEFAULT (`+sqliteNow+`))`,
		`INSERT INTO toolq_schema_migrations (version, name) VALUES ($1, $2)`); err != nil {
		return err
	}
	return tx.Commit()
}

type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, q, args...)
	return err
}

func (t sqlTx) versions(ctx context.Context) (map[int64]bool, error) {
	rows, err := t.tx.QueryContext(ctx, `SELECT version FROM toolq_schema_migrations`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanVersions(rows)
}

// conflicted is always false: SQLite has one writer at a time, which waits
// for the lock (busy_timeout) rather than deadlocking.
func (s *sqliteDB) conflicted(error) bool { return false }

// describe reads a SQLite error: its message, and whether it means the
// database file cannot be used for now (locked, busy, I/O, full disk).
func (s *sqliteDB) describe(err error) (string, bool) {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN:
			return se.Error(), true
		}
		return se.Error(), false
	}
	return err.Error(), false
}
