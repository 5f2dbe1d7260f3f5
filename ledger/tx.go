package ledger

// The ledger: the completion of a transactional write, in the transaction
// of its effect.

import (
	"context"
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
// or not at all. It is how a transactional tool runs. The answers:
//
//   - nil: committed; the output is effect's.
//   - effect's error, as effect returned it: the transaction rolled back,
//     nothing effect wrote remains, and the row is as it was.
//   - ErrFenced or ErrNotFound: the claim is no longer f's (taken over,
//     settled or released): rolled back, so the effect never lands.
//   - ErrInvalidOutput: effect's output is not valid JSON in UTF-8: rolled
//     back.
//   - ErrTxUnsupported: the ledger is SQLite; effect did not run.
//   - any other error (ErrUnavailable among them): the transaction did not
//     commit, or the answer to its commit was lost. The row says which, and
//     a fenced write settles it: Release of f fails (ErrFenced) once the
//     commit has landed, and otherwise gives the claim back.
//
// ctx's deadline (DefaultTimeout without one) bounds the transaction: should
// it sit idle past that, Postgres ends it itself
// (idle_in_transaction_session_timeout), so that a holder cut off from the
// database cannot keep the row, and what effect locked, for longer.
//
// effect is given a pgx.Tx by design: it is the one driver type that
// leaves this package, and its errors are effect's own.
func (s *Store) CompleteTx(ctx context.Context, f Fence, effect TxEffect) (json.RawMessage, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	out, err := s.db.completeTx(ctx, f, effect)
	var ee *effectError
	switch {
	case err == nil:
		return out, nil
	case errors.As(err, &ee):
		return nil, ee.err
	case errors.Is(err, errNoMatch):
		return nil, s.whyNot(ctx, "complete in transaction", f, false)
	}
	return nil, s.translate("complete in transaction", err)
}

// effectError carries the error of a transactional write's effect through
// a backend, so that it is returned as it was, untranslated.
type effectError struct{ err error }

func (e *effectError) Error() string { return e.err.Error() }

// errNoMatch is a backend's fenced completion that matched no row.
var errNoMatch = errors.New("ledger: the completion matched no row")

// completeTx begins the transaction with the server's bound on its idle
// time, runs effect, then the fenced completion, and commits. A completion
// that matches no row rolls back: the effect never lands.
func (p *postgresDB) completeTx(ctx context.Context, f Fence, effect TxEffect) (json.RawMessage, error) {
	idle := time.Second
	if deadline, ok := ctx.Deadline(); ok {
		idle = max(time.Until(deadline), idle)
	}
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{
		// One round trip: an integer of ours, not a parameter.
		BeginQuery: fmt.Sprintf("BEGIN; SET LOCAL idle_in_transaction_session_timeout = %d", idle.Milliseconds()),
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
	out, err := effect(ctx, tx)
	if err != nil {
		p.describe(err) // a demoted primary's refusal resets the pool, as for the ledger's own statements
		return nil, &effectError{err}
	}
	if err := checkOutput("complete in transaction", f.Key, out); err != nil {
		return nil, err
	}
	tag, err := tx.Exec(ctx, postgresQueries.complete, pgArgs(fenceArgs(f, namedArgs{"result": string(out)}))...)
	if err != nil {
		return nil, err
	}
	if tag.RowsAffected() == 0 {
		return nil, errNoMatch
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// completeTx refuses: see ErrTxUnsupported.
func (s *sqliteDB) completeTx(context.Context, Fence, TxEffect) (json.RawMessage, error) {
	return nil, fmt.Errorf("%w (this ledger is SQLite)", ErrTxUnsupported)
}
