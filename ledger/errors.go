package ledger

// The ledger: errors, timeouts and the translation of driver errors.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// Errors of the ledger. They are returned wrapped with the operation's name;
// test them with errors.Is.
var (
	ErrNotFound         = errors.New("ledger: key not found")
	ErrFenced           = errors.New("ledger: fenced out (the claim was taken over, settled or released)")
	ErrLeaseHeld        = errors.New("ledger: lease still held by another attempt")
	ErrMaterialMismatch = errors.New("ledger: key exists with different material (collision or tampering)")
	ErrNotIndeterminate = errors.New("ledger: row is not indeterminate")
	ErrUnavailable      = errors.New("ledger: database unavailable")
	ErrInvalidOutput    = errors.New("ledger: output is not valid JSON in UTF-8")
	ErrResolved         = errors.New("ledger: row was resolved otherwise")
	// ErrTxUnsupported: CompleteTx needs the Postgres ledger. The SQLite
	// ledger is a file private to its consumer: no application keeps its
	// data there, so there is no effect to commit with the row.
	ErrTxUnsupported = errors.New("ledger: transactional writes need the Postgres ledger")
	// ErrTxEnded: the effect of a transactional write ended the
	// transaction it was given (CompleteTx): what it wrote may have
	// committed without the call's completion.
	ErrTxEnded = errors.New("ledger: the effect ended the transaction it was given")
	// ErrNotAwaiting: a decision or a waiter for a call that is not
	// awaiting approval (decided, expired, or never asked); the error says
	// where it is.
	ErrNotAwaiting = errors.New("ledger: the call is not awaiting approval")
	// ErrDecisionRefused: a decision that does not match the call it names
	// (another approver group, another args digest).
	ErrDecisionRefused = errors.New("ledger: decision refused")
	// ErrOtherAttempt: a resolution of another attempt than the row's (it
	// ran again since the operator looked), or of no attempt, of a row
	// resolved before that is indeterminate again.
	ErrOtherAttempt = errors.New("ledger: the row is at another attempt")
	// ErrInvalidDecision: a decision without who decided or why, or with
	// either longer than MaxDecisionBy or MaxDecisionReason.
	ErrInvalidDecision = errors.New("ledger: invalid decision")
)

// DefaultTimeout bounds every call whose context has no deadline.
const DefaultTimeout = 15 * time.Second

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, DefaultTimeout)
}

// redact is u, a database URL or a message that quotes one, with its
// passwords hidden: the userinfo's, and the values of password= and
// sslpassword= (in a URL's query, as libpq and pgx take them, or in a
// keyword/value string).
func redact(u string) string {
	if p, err := url.Parse(u); err == nil && p.Host != "" && !strings.ContainsAny(u, " \t\n") {
		if _, ok := p.User.Password(); ok {
			p.User = url.UserPassword(p.User.Username(), "xxxxx")
		}
		params := strings.Split(p.RawQuery, "&")
		for i, kv := range params {
			k, _, _ := strings.Cut(kv, "=")
			if name, err := url.QueryUnescape(k); err == nil && isPasswordParam(name) {
				params[i] = k + "=xxxxx"
			}
		}
		p.RawQuery = strings.Join(params, "&")
		u = p.String()
	}
	u = userinfoPassword.ReplaceAllString(u, "${1}:xxxxx@")
	return passwordParam.ReplaceAllString(u, "${1}xxxxx")
}

// isPasswordParam says whether a connection parameter is a password.
func isPasswordParam(name string) bool {
	return strings.EqualFold(name, "password") || strings.EqualFold(name, "sslpassword")
}

var (
	// userinfoPassword matches the user and password of a URL in a message
	// (the password up to the last @ before the path).
	userinfoPassword = regexp.MustCompile(`(\w+://[^:/@\s]*):[^\s/?#]*@`)
	// passwordParam matches password= or sslpassword= and what follows it.
	passwordParam = regexp.MustCompile(`(?i)((?:^|[?&\s;,'"(])(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&#\s'"]*)`)
)

// translate turns a driver error into a ledger error, so that no driver type
// leaves the package: one that wraps ErrUnavailable when the database could
// not be reached, or else one that carries only the driver's message.
func (s *Store) translate(op string, err error) error {
	switch {
	case err == nil || isLedgerError(err):
		return err
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("ledger: %s: %w", op, context.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("ledger: %s: %w: %w", op, ErrUnavailable, context.DeadlineExceeded)
	}
	msg, unavailable := s.db.describe(err)
	if unavailable {
		return fmt.Errorf("ledger: %s: %w: %s", op, ErrUnavailable, msg)
	}
	return fmt.Errorf("ledger: %s: %s", op, msg)
}

// conflictTries bounds how often a batch aborted by a deadlock or a
// serialization conflict is run again before the error is returned (as
// ErrUnavailable: the caller retries it later).
const conflictTries = 5

// retryConflicts runs f until it succeeds, fails otherwise than by a
// conflict (see database.conflicted), or has been tried conflictTries times,
// with a short random pause between tries.
func (s *Store) retryConflicts(ctx context.Context, f func() error) error {
	for try := 1; ; try++ {
		err := f()
		if err == nil || try == conflictTries || !s.db.conflicted(err) {
			return err
		}
		pause := time.NewTimer(time.Duration(rand.Int64N(int64(time.Duration(try) * 10 * time.Millisecond))))
		select {
		case <-ctx.Done():
			pause.Stop()
			return err
		case <-pause.C:
		}
	}
}

func isLedgerError(err error) bool {
	for _, e := range []error{ErrNotFound, ErrFenced, ErrLeaseHeld, ErrMaterialMismatch, ErrNotIndeterminate, ErrUnavailable, ErrInvalidOutput, ErrResolved, ErrTxUnsupported, ErrTxEnded, ErrNotAwaiting, ErrDecisionRefused, ErrOtherAttempt} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
