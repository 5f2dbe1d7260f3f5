package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// takenOver claims a call c under a token with a short lease (a), waits
// for the lease to run out, and takes it over under token (taken).
func takenOver(t *testing.T, s *ledger.Store) (c ledger.Claim, a, taken ledger.Row, token string) {
	t.Helper()
	c = newClaim(20 * time.Millisecond)
	c.Token = newToken()
	a = mustClaim(t, s, c)
	waitExpired(t, s, c.Key)
	token = newToken()
	taken, err := s.Takeover(context.Background(), a.Fence(), "B", token, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return c, a, taken, token
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
		_, a, taken, token := takenOver(t, s)
		again, err := s.Takeover(ctx, a.Fence(), "B", token, time.Minute) // its answer was lost: asked again
		if err != nil || again.Fence() != taken.Fence() {
			t.Fatalf("the same takeover asked again: %v, row %+v; want its own row at attempt %d", err, again.Fence(), taken.Attempt)
		}
	})
}

// TestATakeoverAskedAgainNeverFindsARowNoLongerItsOwn: the takeover asked
// again finds the row it took only while that take stands: once the row
// was settled, or released and claimed again under the same token, it is
// fenced.
func TestATakeoverAskedAgainNeverFindsARowNoLongerItsOwn(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		for _, after := range []string{"completed", "released and claimed again"} {
			c, a, taken, token := takenOver(t, s)
			switch after {
			case "completed":
				if err := s.Complete(ctx, taken.Fence(), json.RawMessage(`{"ok":true}`)); err != nil {
					t.Fatal(err)
				}
			default:
				if err := s.Release(ctx, taken.Fence()); err != nil {
					t.Fatal(err)
				}
				again := c
				again.Token = token // the same token: still not the take asked about
				if r := claimOne(t, s, again); !r.Claimed || r.Row.Attempt != taken.Attempt+1 {
					t.Fatalf("claim after the release: %+v", r)
				}
			}
			if row, err := s.Takeover(ctx, a.Fence(), "B", token, time.Minute); err == nil {
				t.Fatalf("%s: the takeover asked again took row %+v", after, row.Fence())
			}
		}
	})
}

// TestApprovalStatusOfEachState: approved (released, then claimed), denied
// and unknown keys.
func TestApprovalStatusOfEachState(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c, _ := awaiting(t, s, payment)
		if st, err := s.ApprovalStatusOf(ctx, c.Key); err != nil || st != ledger.ApprovalAwaiting {
			t.Fatalf("awaiting: %q %v", st, err)
		}
		if _, err := s.Decide(ctx, c.Key, ledger.Decision{Approve: true, By: "alice", Reason: "ok"}); err != nil {
			t.Fatal(err)
		}
		if st, err := s.ApprovalStatusOf(ctx, c.Key); err != nil || st != ledger.ApprovalApproved {
			t.Fatalf("approved (released): %q %v", st, err)
		}
		d, _ := awaiting(t, s, payment)
		if _, err := s.Decide(ctx, d.Key, ledger.Decision{Approve: false, By: "alice", Reason: "no"}); err != nil {
			t.Fatal(err)
		}
		if st, err := s.ApprovalStatusOf(ctx, d.Key); err != nil || st != ledger.ApprovalDenied {
			t.Fatalf("denied: %q %v", st, err)
		}
		if _, err := s.ApprovalStatusOf(ctx, "nokey"); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("unknown key: %v", err)
		}
	})
}

// TestListedResultsAreTheirOwn: each row of a list keeps its own result and
// history bytes after the next rows are read (a driver that reuses its
// read buffer would leave them all holding the last).
func TestListedResultsAreTheirOwn(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		conv := fmt.Sprintf("conv-list-%d", time.Now().UnixNano())
		want := map[string]string{}
		var claims []ledger.Claim
		for i := range 5 {
			c := newClaim(time.Minute)
			c.ConversationID = conv
			row := mustClaim(t, s, c)
			out := fmt.Sprintf(`{"n":%d,"pad":"%0200d"}`, i, i)
			if err := s.Complete(ctx, row.Fence(), json.RawMessage(out)); err != nil {
				t.Fatal(err)
			}
			want[c.Key] = out
			claims = append(claims, c)
		}
		// A batch of duplicates: the claim statement's rows (and its leading
		// column), or the read of settled rows before it.
		res, err := s.Claim(ctx, claims)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Claimed || string(r.Row.Result) != want[claims[i].Key] {
				t.Errorf("duplicate claim of %s: claimed %v, result %s", claims[i].Key, r.Claimed, r.Row.Result)
			}
		}
		rows, err := s.List(ctx, ledger.Filter{ConversationID: conv})
		if err != nil || len(rows) != 5 {
			t.Fatalf("list: %d rows, %v", len(rows), err)
		}
		for _, r := range rows {
			if string(r.Result) != want[r.Key] {
				t.Errorf("row %s: result %s, want %s", r.Key, r.Result, want[r.Key])
			}
		}
	})
}
