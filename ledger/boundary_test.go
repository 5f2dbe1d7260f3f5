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

// TestAnApprovalReadAsExpiredCannotBeApprovedAfterwards: the approval's
// end is one instant for every reader, as the lease's is. ApprovalStatusOf
// says expired by the host's clock against ApprovalExpiresAt rounded to
// the millisecond; Decide's approve asks approval_expires_at > now() of the
// database. A call read as expired is approved right after.
func TestAnApprovalReadAsExpiredCannotBeApprovedAfterwards(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		info := payment
		info.TTL = 20 * time.Millisecond
		for range 60 {
			c, _ := awaiting(t, s, info)
			deadline := time.Now().Add(10 * time.Second)
			for {
				st, err := s.ApprovalStatusOf(ctx, c.Key)
				if err != nil {
					t.Fatal(err)
				}
				if st == ledger.ApprovalExpired {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s never read as expired", c.Key)
				}
			}
			row, err := s.Decide(ctx, c.Key, ledger.Decision{Approve: true, By: "alice", Reason: "ok"})
			if !errors.Is(err, ledger.ErrNotAwaiting) {
				t.Fatalf("%s read as expired, then approved: err %v, row %s %s (expires at %s)", c.Key, err, row.State,
					row.ApprovalStatus, row.ApprovalExpiresAt.Format(time.RFC3339Nano))
			}
		}
	})
}

// TestATakeoverAskedAgainAfterItsAnswerWasLostFindsItsOwnRow: a takeover
// whose answer was lost after it committed (the worker asks again, under
// the same token, through durably) is this taker's, as a claim asked
// again finds its own row by its token; it is not fenced out as if
// another taker had won, which leaves the row held by nobody until the
// new lease ends.
func TestATakeoverAskedAgainAfterItsAnswerWasLostFindsItsOwnRow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c := newClaim(20 * time.Millisecond)
		a := mustClaim(t, s, c)
		waitExpired(t, s, c.Key)
		token := newToken()
		taken, err := s.Takeover(ctx, a.Fence(), "B", token, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		again, err := s.Takeover(ctx, a.Fence(), "B", token, time.Minute) // its answer was lost: asked again
		if err != nil || again.Fence() != taken.Fence() {
			t.Fatalf("the same takeover asked again: %v, row %+v; want its own row at attempt %d", err, again.Fence(), taken.Attempt)
		}
	})
}
