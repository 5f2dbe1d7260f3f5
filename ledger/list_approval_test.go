package ledger_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/toolq/toolq/ledger"
)

// listKeys lists f and returns the keys, in the list's order, and the
// total f selects.
func listKeys(t *testing.T, s *ledger.Store, f ledger.Filter) ([]string, int64) {
	t.Helper()
	rows, err := s.List(context.Background(), f)
	if err != nil {
		t.Fatalf("list %+v: %v", f, err)
	}
	total, err := s.Total(context.Background(), f)
	if err != nil {
		t.Fatalf("total %+v: %v", f, err)
	}
	keys := []string{}
	for _, r := range rows {
		keys = append(keys, r.Key)
	}
	return keys, total
}

// TestListSelectsCallsByApproverGroupAndExpiry: the calls awaiting one
// group's approval are selected in the database, however many of another
// group's there are, the first to expire first, and Total counts those
// past the limit. Args holding \u0000 and a surrogate without its pair,
// which Postgres's json refuses to make text of, are selected too.
func TestListSelectsCallsByApproverGroupAndExpiry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ops := ledger.ApprovalInfo{Args: json.RawMessage(`{"host":"web-1","note":"\u0000\ud800\\u0000"}`), Group: "ops", TTL: time.Minute}
		for range 30 {
			awaiting(t, s, ops)
		}
		var want []string // the first to expire first
		for _, ttl := range []time.Duration{3 * time.Hour, time.Hour, 2 * time.Hour} {
			info := payment
			info.TTL = ttl
			c, _ := awaiting(t, s, info)
			want = append(want, c.Key)
		}
		want[0], want[1], want[2] = want[1], want[2], want[0]
		f := ledger.Filter{State: ledger.AwaitingApproval, Groups: []string{"finance"}, Order: ledger.OldestExpiryFirst, Limit: 2}
		got, total := listKeys(t, s, f)
		if !slices.Equal(got, want[:2]) || total != 3 {
			t.Fatalf("finance's first two: %v of %d, want %v of 3", got, total, want[:2])
		}
		f.Limit = 0
		if got, _ := listKeys(t, s, f); !slices.Equal(got, want) {
			t.Fatalf("finance's calls: %v, want %v", got, want)
		}
		f.Groups = []string{"ops", "finance"}
		if _, total := listKeys(t, s, f); total != 33 {
			t.Fatalf("ops and finance: %d calls, want 33", total)
		}
		f.Groups = []string{"legal"}
		if got, total := listKeys(t, s, f); len(got) != 0 || total != 0 {
			t.Fatalf("legal: %v (%d)", got, total)
		}
		// A call that never needed approval belongs to no group.
		mustClaim(t, s, newClaim(time.Minute))
		if _, total := listKeys(t, s, ledger.Filter{Groups: []string{"ops", "finance"}}); total != 33 {
			t.Fatalf("ops and finance in any state: %d calls, want 33", total)
		}
	})
}

// TestListGivesDecidedCallsByTheirDecisionWithApprovedCallsNotRunYet: the
// calls whose approval was decided, the latest decision first (not the
// latest update: an approved call that ran since keeps its place), with
// the approved call that has not run yet (released until a worker claims
// it) among them, and neither the calls awaiting nor those that never
// needed approval. A history holding an output with \u0000 and a lone
// surrogate is read on Postgres too.
func TestListGivesDecidedCallsByTheirDecisionWithApprovedCallsNotRunYet(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		awaiting(t, s, payment) // undecided
		mustClaim(t, s, newClaim(time.Minute))
		var order []string // the decided, in the order of their decisions
		var last time.Time
		decide := func(approve bool) ledger.Claim {
			t.Helper()
			c, row := awaiting(t, s, payment)
			for !time.Now().After(last.Add(time.Millisecond)) { // decision times apart
				time.Sleep(time.Millisecond)
			}
			d, err := s.Decide(ctx, c.Key, ledger.Decision{Approve: approve, By: "alice", Reason: "checked", Group: "finance", Digest: row.ArgsDigest})
			if err != nil {
				t.Fatal(err)
			}
			last = d.LastDecision().At
			order = append(order, c.Key)
			return c
		}
		decide(false)
		ran := decide(true)
		notRun := decide(true)
		// The first approved call runs, is indeterminate, and is resolved
		// with an output Postgres cannot make text of.
		ran.Token = newToken()
		row := mustClaim(t, s, ran)
		if err := s.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset", Message: "reset"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Resolve(ctx, ran.Key, ledger.Resolution{Output: json.RawMessage(`{"memo":"\u0000\udc00"}`), By: "op", Reason: "paid"}); err != nil {
			t.Fatal(err)
		}
		slices.Reverse(order)
		f := ledger.Filter{Approval: "decided", Groups: []string{"finance"}, Order: ledger.LatestDecisionFirst}
		got, total := listKeys(t, s, f)
		if !slices.Equal(got, order) || total != 3 {
			t.Fatalf("decided calls: %v (%d), want %v", got, total, order)
		}
		if byUpdate, _ := listKeys(t, s, ledger.Filter{Approval: "decided"}); byUpdate[0] != ran.Key {
			t.Fatalf("by the latest update: %v, want %s first (it ran last)", byUpdate, ran.Key)
		}
		rows, err := s.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if rows[0].Key != notRun.Key || rows[0].State != ledger.Released || rows[0].ApprovalStatus != ledger.ApprovalApproved {
			t.Fatalf("the approved call not run yet: %s %s %s", rows[0].Key, rows[0].State, rows[0].ApprovalStatus)
		}
		if got, _ := listKeys(t, s, ledger.Filter{Approval: "approved"}); len(got) != 2 {
			t.Fatalf("approved calls: %v, want the one that ran and the one that did not", got)
		}
		// Listing by state or without an approval filter never lists a
		// released row.
		if got, _ := listKeys(t, s, ledger.Filter{}); slices.Contains(got, notRun.Key) {
			t.Fatalf("a released row is listed without an approval filter: %v", got)
		}
	})
}

func TestListRefusesAnOrderItCannotGive(t *testing.T) {
	t.Parallel()
	s := openStore(t, "sqlite")
	for _, f := range []ledger.Filter{{Order: ledger.Order(7)}, {Stale: true, Order: ledger.OldestExpiryFirst}} {
		if _, err := s.List(context.Background(), f); err == nil {
			t.Errorf("%+v: listed", f)
		}
		if _, err := s.Total(context.Background(), f); err == nil {
			t.Errorf("%+v: counted", f)
		}
	}
}
