package ledger

// The ledger: the completion of a transactional write, in the transaction
// of its effect.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TxEffect is the effect of a transactional write: what it writes through
// tx commits with the call's completion, or not at all. It must not end tx.
type TxEffect func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error)

// CompleteTx runs effect in a transaction of the ledger's database and, in
// the same transaction, completes the claim f with effect's output, as
// Complete would: what effect writes and the completed row commit together
// or not at all. It is how a transactional tool runs.
//
// The transaction first locks the row under f's fence, so that a stale
// claim fails before effect runs and no takeover changes the row while the
// transaction lives: one waits for its end, and then finds the row
// completed, or as it was. Extending the lease through another connection
// would wait on that lock too: a holder does not while the transaction
// lives. The transaction is READ COMMITTED whatever the database's default:
// in a serializable one, the ledger's own read of the row would make it
// conflict with the ledger's other writes (its predicate locks cover index
// pages), and fail to commit under load for no fault of the call's. effect
// cannot change it (SET TRANSACTION fails after the lock, SQLSTATE 25001):
// it locks what it reads and must not change (SELECT … FOR UPDATE, or an
// UPDATE whose WHERE checks, which Postgres checks again on the row's
// latest version). After it, the connection's session is reset (txReset)
// before it serves another statement. The answers:
//
//   - nil: committed; the output is effect's.
//   - effect's error, as effect returned it: the transaction rolled back,
//     nothing effect wrote remains, and the row is as it was.
//   - ErrTxEnded: effect ended the transaction (a COMMIT or ROLLBACK
//     statement), whatever it returned: what it wrote before may have
//     committed without the row, which is as it was.
//   - ErrFenced or ErrNotFound: the claim is no longer f's (taken over,
//     settled or released): rolled back, so the effect never lands.
//   - ErrInvalidOutput: effect's output is not valid JSON in UTF-8: rolled
//     back.
//   - ErrTxUnsupported: the ledger is SQLite; effect did not run.
//   - a conflict with another transaction in the completion or its commit
//     (a deadlock in a foreign key check deferred to the commit, say):
//     rolled back, and the row is as it was. Not ErrUnavailable: it is the
//     call's transaction that conflicted, and it may again.
//   - any other error (ErrUnavailable among them): the transaction did not
//     commit, or the answer to its commit was lost. The row says which, and
//     a fenced write settles it: Release of f fails (ErrFenced) once the
//     commit has landed, and otherwise gives the claim back.
//
// ctx's deadline (DefaultTimeout without one) bounds the transaction: should
// it sit idle past that, Postgres ends it itself
// (idle_in_transaction_session_timeout), so that a holder cut off from the
// database cannot keep the row, and what effect locked, for longer. The
// commit waits for the disk as the ledger's own writes do
// (synchronous_commit as the session has it, whatever effect set).
//
// effect is given a pgx.Tx by design: it is the one driver type that
// leaves this package, and its errors are effect's own.
func (s *Store) CompleteTx(ctx context.Context, f Fence, effect TxEffect) (json.RawMessage, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	out, err := s.db.completeTx(ctx, f, effect)
	var ee *effectError
	var ce *conflictError
	switch {
	case err == nil:
		return out, nil
	case errors.As(err, &ee):
		return nil, ee.err
	case errors.Is(err, errNoMatch):
		return nil, s.whyNot(ctx, "complete in transaction", f)
	case errors.As(err, &ce):
		msg, _ := s.db.describe(ce.err)
		return nil, fmt.Errorf("ledger: complete in transaction %s: the transaction conflicted with another and rolled back: %s", f.Key, msg)
	}
	return nil, s.translate("complete in transaction", err)
}

// effectError carries the error of a transactional write's effect through
// a backend, so that it is returned as it was, untranslated.
type effectError struct{ err error }

func (e *effectError) Error() string { return e.err.Error() }

// conflictError is a backend's transaction that conflicted with another
// (database.conflicted) in its completion or its commit.
type conflictError struct{ err error }

func (e *conflictError) Error() string { return e.err.Error() }

// errNoMatch is a backend's fenced completion that matched no row.
var errNoMatch = errors.New("ledger: the completion matched no row")

// The statements of a transactional write, after its BEGIN. The
// transaction is marked with a setting of its own, toolq.tx, which ends
// with it: a transaction that does not have it is not the one the ledger
// began.
const (
	// txLock locks the row under the claim's fence (FOR NO KEY UPDATE, the
	// lock an UPDATE of the row takes and waits for).
	txLock = `SELECT 1 FROM toolq_ledger ` + pgFenced + ` FOR NO KEY UPDATE`
	// txMarked tells whether the transaction is the one marked @tx.
	txMarked = `SELECT current_setting('toolq.tx', true) IS NOT DISTINCT FROM @tx::text`
	// txCommit commits with synchronous_commit as the session has it,
	// whatever the effect set for its transaction.
	txCommit = `SET LOCAL synchronous_commit TO DEFAULT; COMMIT`
	// txReset ends what a statement can leave on a session besides its
	// transaction: advisory locks, cursors WITH HOLD, LISTEN, a role or
	// session settings of its own (set_config(…, false)), temporary tables
	// and sequences' state. The connection's own settings (those its URL
	// gives) stay. Prepared statements stay too: pgx's, which DISCARD ALL
	// would drop behind its back.
	txReset = `SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; SET SESSION AUTHORIZATION DEFAULT; RESET ALL;
		DISCARD TEMP; DISCARD SEQUENCES`
)

// txComplete is the completion, in the transaction marked @tx alone:
// outside it, it matches nothing.
var txComplete = postgresQueries.complete + ` AND current_setting('toolq.tx', true) = @tx::text`

// completeTx begins the transaction with the server's bound on its idle
// time and its mark, locks the row, runs effect, checks that the
// transaction is still the one it began, runs the fenced completion, and
// commits. A completion that matches no row rolls back: the effect never
// lands. The connection's session is reset before it goes back to the
// pool.
func (p *postgresDB) completeTx(ctx context.Context, f Fence, effect TxEffect) (json.RawMessage, error) {
	idle := time.Second
	if deadline, ok := ctx.Deadline(); ok {
		idle = max(time.Until(deadline), idle)
	}
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	defer resetSession(ctx, conn.Conn())
	mark := rand.Text()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{
		// One round trip: an integer and a text of ours, not parameters.
		BeginQuery: fmt.Sprintf("BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = %d; SET LOCAL toolq.tx = '%s'",
			idle.Milliseconds(), mark),
		CommitQuery: txCommit,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		// Bounded: a connection cut off from the server must not hold the
		// call. A rollback that fails closes the connection, which ends
		// the transaction on the server too.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		tx.Rollback(ctx) // after Commit: nothing to do
	}()
	var locked int
	switch err := tx.QueryRow(ctx, txLock, pgArgs(fenceArgs(f, nil))...).Scan(&locked); {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, errNoMatch
	case err != nil:
		return nil, err
	}
	out, err := effect(ctx, tx)
	if err != nil {
		p.describe(err) // a demoted primary's refusal resets the pool, as for the ledger's own statements
		if ended, _ := txEnded(ctx, tx, mark); ended {
			return nil, fmt.Errorf("%w: complete in transaction %s: its effect failed after that (%v)", ErrTxEnded, f.Key, err)
		}
		return nil, &effectError{err}
	}
	if tx.Conn().PgConn().TxStatus() == 'I' {
		return nil, fmt.Errorf("%w: complete in transaction %s", ErrTxEnded, f.Key)
	}
	if err := checkOutput("complete in transaction", f.Key, out); err != nil {
		return nil, err
	}
	tag, err := tx.Exec(ctx, txComplete, pgArgs(fenceArgs(f, namedArgs{"result": string(out), "tx": mark}))...)
	switch {
	case p.conflicted(err):
		return nil, &conflictError{err: err}
	case err != nil:
		return nil, err
	case tag.RowsAffected() == 0:
		if ended, err := txEnded(ctx, tx, mark); err != nil || ended {
			return nil, cmp.Or(err, fmt.Errorf("%w: complete in transaction %s", ErrTxEnded, f.Key))
		}
		return nil, errNoMatch
	}
	if err := tx.Commit(ctx); err != nil {
		if p.conflicted(err) {
			return nil, &conflictError{err: err}
		}
		return nil, err
	}
	return out, nil
}

// txEnded reports whether the transaction the ledger began as mark has
// ended (its status idle, or another in its place, without the mark). A
// transaction in which a statement failed can be asked nothing: it is
// taken for the ledger's (an effect that ended it, began another and
// failed in that would pass for it; the sql executor cannot).
func txEnded(ctx context.Context, tx pgx.Tx, mark string) (bool, error) {
	switch tx.Conn().PgConn().TxStatus() {
	case 'I':
		return true, nil
	case 'E':
		return false, nil
	}
	var marked bool
	if err := tx.QueryRow(ctx, txMarked, pgx.NamedArgs{"tx": mark}).Scan(&marked); err != nil {
		return false, err
	}
	return !marked, nil
}

// resetSession resets what a transactional write may have left on the
// session of conn (txReset) once its transaction has ended, or closes the
// connection, so that the pool drops it, when it cannot.
func resetSession(ctx context.Context, conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if conn.PgConn().TxStatus() != 'I' {
		conn.Close(ctx)
		return
	}
	if _, err := conn.Exec(ctx, txReset); err != nil {
		conn.Close(ctx)
	}
}

// completeTx refuses: see ErrTxUnsupported.
func (s *sqliteDB) completeTx(context.Context, Fence, TxEffect) (json.RawMessage, error) {
	return nil, fmt.Errorf("%w (this ledger is SQLite)", ErrTxUnsupported)
}
