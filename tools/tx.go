package tools

// Transactional tools: an effect written in the ledger's own database, in
// the transaction that completes the call's claim.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// TxExecutor runs the calls of a transactional_write in a transaction of
// the ledger's own Postgres database: the one that records the call's
// completion, so that what it writes and the ledger row commit together or
// not at all. ExecuteTx returns the output (JSON), or an error that
// Classify maps to an Outcome. A DefiniteError is the call's answer, and
// the transaction rolls back first: a failed call leaves no effect. Any
// other error rolls the transaction back too, and since nothing of the call
// happened it runs again: there is no ambiguous outcome.
//
// An error of Postgres's (a *pgconn.PgError, wrapped or not) is classified
// by its SQLSTATE as the sql executor's are: one the database's state
// caused (a conflict, a lost connection) is not sent, any other is a
// definite failure.
//
// It writes only through tx: what it does elsewhere (an HTTP call, another
// database) is not in the transaction and may happen more than once. The
// transaction is READ COMMITTED, whatever the database's default, and the
// ledger has queried it before: SET TRANSACTION fails (SQLSTATE 25001).
// What it reads and must not change before the commit, it locks (SELECT …
// FOR UPDATE). It must not end tx: the Tx it is given refuses Commit and
// Rollback (Begin, a savepoint, is fine), and a COMMIT or ROLLBACK
// statement sent through it is found once it returns, whatever it returned
// (ledger.ErrTxEnded): the call is then left indeterminate (code
// CodeTxEnded).
type TxExecutor interface {
	ExecuteTx(ctx context.Context, tx pgx.Tx, req Request) (json.RawMessage, error)
}

// TxExecutorFunc adapts a function to TxExecutor: a transactional tool
// written in Go.
type TxExecutorFunc func(ctx context.Context, tx pgx.Tx, req Request) (json.RawMessage, error)

// ExecuteTx calls f.
func (f TxExecutorFunc) ExecuteTx(ctx context.Context, tx pgx.Tx, req Request) (json.RawMessage, error) {
	return f(ctx, tx, req)
}

// InTx runs effect in a transaction and commits it together with the
// completion of the call, or not at all; it returns the output effect
// returned, once committed. The worker's is the ledger's Store.CompleteTx
// under the call's claim.
type InTx func(ctx context.Context, effect func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error)) (json.RawMessage, error)

// RunTx runs a call of a transactional_write: it waits for one of the
// tool's concurrency slots (ctx governs the wait, as in Run; BeforeSend is
// honoured as there), then calls inTx with the tool's effect: its
// TxExecutor under the tool's timeout and circuit breaker, a panic
// recovered. inTx runs the effect in the transaction it commits with the
// call's completion; its answer is RunTx's. The key is always in
// req.Key (there is no downstream to withhold it from).
//
// An error that is an *Error (errors.As) is the effect's, and its
// transaction did not commit: ending ctx before the start, an open breaker
// and a BeforeSend refusal give NotSent as Run does. Any other error is
// inTx's own, returned as it was.
func (t *Tool) RunTx(ctx context.Context, req Request, inTx InTx, opts ...RunOption) (json.RawMessage, error) {
	if t.txExecutor == nil {
		return nil, DefiniteError("not_transactional", fmt.Sprintf("tool %q is a %s: it runs with Run", t.Name, t.Class))
	}
	var o runOptions
	for _, opt := range opts {
		opt(&o)
	}
	select {
	case t.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, NotSentError(CodeCancelled, "gave up waiting for a concurrency slot", 0, ctx.Err())
	}
	defer func() { <-t.slots }()
	if err := ctx.Err(); err != nil {
		return nil, NotSentError(CodeCancelled, "cancelled before starting", 0, err)
	}
	if o.beforeSend != nil {
		if err := o.beforeSend(ctx); err != nil {
			return nil, NotSentError(CodeNotStarted, "not started: "+err.Error(), 0, err)
		}
	}
	// Once started, the transaction runs to its commit or its end, as a
	// call of Run does: the drain does not cut it off.
	return inTx(context.WithoutCancel(ctx), func(ctx context.Context, tx pgx.Tx) (json.RawMessage, error) {
		return t.breaker.run(func() (json.RawMessage, error) {
			ctx, cancel := context.WithTimeout(ctx, t.Timeout)
			defer cancel()
			out, err := t.effect(ctx, tx, req)
			if err != nil {
				_, classified := Classify(err)
				if !utf8.ValidString(classified.Message) { // it is stored and published as text
					copied := *classified
					copied.Message = strings.ToValidUTF8(copied.Message, "\uFFFD")
					classified = &copied
				}
				return nil, classified
			}
			if !json.Valid(out) {
				return nil, AmbiguousError("invalid_output", "the executor returned output that is not JSON", 0, nil)
			}
			return validUTF8(out), nil
		})
	})
}

// effect calls the executor with a Tx it cannot end, a panic recovered as
// an ambiguous error. An error of Postgres's it returns is classified by its
// SQLSTATE, as the sql executor's are (sqlError). Once it has returned
// output, the constraints it deferred are checked (SET CONSTRAINTS ALL
// IMMEDIATE), so that one it broke is its definite failure rather than a
// refusal of the commit that completes the call.
//
// Whether the executor ended the transaction (a COMMIT statement) is not
// told here: the transaction's owner asks (ledger.ErrTxEnded), whatever
// the executor returned.
func (t *Tool) effect(ctx context.Context, tx pgx.Tx, req Request) (out json.RawMessage, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, AmbiguousError("panic", fmt.Sprintf("the executor panicked: %v", p), 0, nil)
		}
	}()
	out, err = t.txExecutor.ExecuteTx(ctx, ownTx{tx}, req)
	if err != nil {
		var te *Error
		if !errors.As(err, &te) {
			err = sqlError(err)
		}
		return nil, err
	}
	switch tx.Conn().PgConn().TxStatus() {
	case 'E':
		return nil, AmbiguousError("failed_transaction", "the executor returned output, but a statement of its transaction failed", 0, nil)
	case 'T':
		if _, err := tx.Exec(ctx, "SET CONSTRAINTS ALL IMMEDIATE"); err != nil {
			return nil, sqlError(err)
		}
	}
	return out, nil
}

// errNotYours is what a transactional executor gets when it tries to end
// its transaction.
var errNotYours = errors.New("tools: the transaction commits with the call's ledger row: a transactional executor does not end it")

// ownTx is the Tx a transactional executor is given: the ledger's, which
// it may not commit or roll back (a savepoint of its own, Begin, it may).
type ownTx struct{ pgx.Tx }

func (ownTx) Commit(context.Context) error   { return errNotYours }
func (ownTx) Rollback(context.Context) error { return errNotYours }
