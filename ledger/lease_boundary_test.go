package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/toolq/toolq/ledger"
)

// The lease's end is one instant for every reader: a row read as expired
// can be taken over at once, and a takeover asked just before the end is
// told the lease is held, never that its claim was fenced. Both are asked
// at the boundary, where the database's clock and the row's figures meet,
// over many leases so that the sub-millisecond instants are reached.

// TestARowReadAsExpiredCanBeTakenOverAtOnce: Postgres rounded the lease's
// remaining time to the nearest millisecond, so a row with under half a
// millisecond left read as expired and the takeover that followed was
// refused as fenced.
func TestARowReadAsExpiredCanBeTakenOverAtOnce(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		for range 40 {
			c := newClaim(20 * time.Millisecond)
			a := mustClaim(t, s, c)
			for {
				if row := mustGet(t, s, c.Key); row.LeaseExpired() {
					break
				}
			}
			if _, err := s.Takeover(ctx, a.Fence(), "B", newToken(), time.Minute); err != nil {
				t.Fatalf("takeover of %s right after it read as expired: %v", c.Key, err)
			}
		}
	})
}

// TestATakeoverRefusedAtTheLeasesEndIsToldTheLeaseIsHeld: a takeover the
// database refused because the lease ran is ErrLeaseHeld, even when the
// lease has ended by the time the refusal is explained.
func TestATakeoverRefusedAtTheLeasesEndIsToldTheLeaseIsHeld(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		for range 40 {
			c := newClaim(20 * time.Millisecond)
			a := mustClaim(t, s, c)
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, err := s.Takeover(ctx, a.Fence(), "B", newToken(), time.Minute)
				if err == nil {
					break
				}
				if !errors.Is(err, ledger.ErrLeaseHeld) {
					t.Fatalf("takeover of %s as its lease ends: %v, want ErrLeaseHeld", c.Key, err)
				}
				if time.Now().After(deadline) {
					t.Fatalf("the lease of %s never ended: %v", c.Key, err)
				}
			}
		}
	})
}
