package ledger

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestPostgresErrorClasses: the SQLSTATEs that mean "try again later" wrap
// ErrUnavailable, so that the worker retries them; the others do not.
func TestPostgresErrorClasses(t *testing.T) {
	t.Parallel()
	s := &Store{db: &postgresDB{}, backend: "postgres"}
	for _, tc := range []struct {
		code        string
		unavailable bool
	}{
		{"40P01", true},  // deadlock_detected, after retryConflicts gave up
		{"40001", true},  // serialization_failure, likewise
		{"08006", true},  // connection_failure
		{"57P01", true},  // admin_shutdown
		{"53300", true},  // too_many_connections
		{"25006", true},  // read_only_sql_transaction: a demoted primary
		{"22021", false}, // character_not_in_repertoire: this row is wrong
		{"23505", false}, // unique_violation
	} {
		err := s.translate("op", &pgconn.PgError{Code: tc.code, Message: "m"})
		if errors.Is(err, ErrUnavailable) != tc.unavailable {
			t.Errorf("SQLSTATE %s: %v, want unavailable=%v", tc.code, err, tc.unavailable)
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			t.Errorf("SQLSTATE %s: the driver error leaks: %#v", tc.code, err)
		}
	}
}

// TestRetryConflicts: a batch aborted by a deadlock runs again, a bounded
// number of times; other errors are not retried.
func TestRetryConflicts(t *testing.T) {
	t.Parallel()
	s := &Store{db: &postgresDB{}, backend: "postgres"}
	deadlock := &pgconn.PgError{Code: "40P01"}
	calls := 0
	err := s.retryConflicts(context.Background(), func() error {
		if calls++; calls < 3 {
			return deadlock
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("deadlocked twice, then passed: %d calls, %v", calls, err)
	}
	calls = 0
	err = s.retryConflicts(context.Background(), func() error { calls++; return deadlock })
	if !errors.Is(err, deadlock) || calls != conflictTries {
		t.Fatalf("always deadlocked: %d calls, %v", calls, err)
	}
	calls = 0
	other := &pgconn.PgError{Code: "22021"}
	err = s.retryConflicts(context.Background(), func() error { calls++; return other })
	if !errors.Is(err, other) || calls != 1 {
		t.Fatalf("another error: %d calls, %v", calls, err)
	}
}
