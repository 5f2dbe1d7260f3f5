package inbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/inbox"
	"github.com/toolq/toolq/ledger"
)

// TestAnotherGroupsCallsDoNotHideAnApproversPendingCall: the inbox lists
// the calls awaiting the approval of the session's groups. 200 newer calls
// of another group (an agent that makes many calls of an ops tool that
// needs approval) do not push alice's finance call off her page.
func TestAnotherGroupsCallsDoNotHideAnApproversPendingCall(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	pay := b.awaiting(t, "finance", `{"amount_cents":90000,"to":"acct_9"}`)
	for i := range 200 {
		b.awaiting(t, "ops", fmt.Sprintf(`{"host":"web-%d"}`, i))
	}
	alice := b.browser(t)
	alice.login(aliceToken)
	if l := alice.list("/api/pending"); keysOf(l) != pay.Key || l.More != 0 {
		t.Fatalf("alice's pending calls: %q and %d more, want her finance call %s alone", keysOf(l), l.More, pay.Key)
	}
}

// TestTheFirstPendingCallsToExpireAreListedAndTheRestCounted: with more
// calls awaiting than a page lists, it lists those that expire first (the
// oldest requests, when they wait as long) and says how many more there
// are.
func TestTheFirstPendingCallsToExpireAreListedAndTheRestCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	first := b.awaiting(t, "finance", `{"amount_cents":90000,"to":"acct_first"}`)
	for i := range 200 {
		b.awaiting(t, "finance", fmt.Sprintf(`{"amount_cents":%d}`, 60000+i))
	}
	soonest := b.awaitingFor(t, "finance", `{"amount_cents":1}`, time.Minute)
	alice := b.browser(t)
	alice.login(aliceToken)
	l := alice.list("/api/pending")
	if len(l.Calls) != 200 || l.More != 2 || l.Calls[0].Key != soonest.Key || l.Calls[1].Key != first.Key {
		t.Fatalf("%d listed, %d more, first %s then %s; want 200 and 2 more, %s (it expires first) then %s (the oldest request)",
			len(l.Calls), l.More, l.Calls[0].Key, l.Calls[1].Key, soonest.Key, first.Key)
	}
}

// TestAnApproversHistoryIsNotHiddenByPendingCalls: alice's decided call
// stays in her history while 200 calls of another group await approval.
func TestAnApproversHistoryIsNotHiddenByPendingCalls(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	pay := b.awaiting(t, "finance", `{"amount_cents":90000}`)
	alice := b.browser(t)
	alice.login(aliceToken)
	if res := alice.do(http.MethodPost, "/api/decide", decide(pay.Key, "deny", "not on the invoice", pay.ArgsDigest)); res.status != http.StatusOK {
		t.Fatalf("deny: %d %s", res.status, res.body)
	}
	for i := range 200 {
		b.awaiting(t, "ops", fmt.Sprintf(`{"host":"web-%d"}`, i))
	}
	if got := keysOf(alice.list("/api/history")); got != pay.Key {
		t.Fatalf("alice's history: %q, want her decision on %s", got, pay.Key)
	}
}

// TestAnApprovedCallThatHasNotRunIsInTheHistory: once alice approves a
// call it leaves her pending list; until a worker claims it to run it (at
// once, or after the sweep when NATS was down, or never when its job was
// dead-lettered) its row is released. It is in her history, approved and
// not run yet.
func TestAnApprovedCallThatHasNotRunIsInTheHistory(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	pay := b.awaiting(t, "finance", `{"amount_cents":90000}`)
	alice := b.browser(t)
	alice.login(aliceToken)
	if res := alice.do(http.MethodPost, "/api/decide", decide(pay.Key, "approve", "invoice 42 checked", pay.ArgsDigest)); res.status != http.StatusOK {
		t.Fatalf("approve: %d %s", res.status, res.body)
	}
	if p := alice.list("/api/pending"); len(p.Calls) != 0 {
		t.Fatalf("still pending: %s", keysOf(p))
	}
	h := alice.list("/api/history")
	if keysOf(h) != pay.Key || h.Calls[0].Decision != "approved" || h.Calls[0].State != "not_run_yet" || h.Calls[0].By != "alice" {
		t.Fatalf("history after the approval: %+v, want the approved call %s, not run yet", h.Calls, pay.Key)
	}
}

// TestEachApproverListsExactlyTheCallsOfTheirGroups: for any groups and any
// calls, some of them decided, each approver's pending list holds exactly
// the calls awaiting the approval of their groups, the first to expire
// first, and their history exactly the decided calls of their groups, the
// latest decision first, each up to the page's limit with a count of the
// rest.
func TestEachApproverListsExactlyTheCallsOfTheirGroups(t *testing.T) {
	t.Parallel()
	groups := []string{"finance", "ops", "legal", "hr"}
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 27))
			limit := 1 + rng.IntN(8)
			var approvers []inbox.Approver
			for i := range 1 + rng.IntN(3) {
				var gs []string
				for _, g := range groups {
					if rng.IntN(2) == 0 {
						gs = append(gs, g)
					}
				}
				if len(gs) == 0 {
					gs = groups[:1]
				}
				approvers = append(approvers, approver(fmt.Sprintf("approver%d", i), fmt.Sprintf("token-%d-0123456789abcdef", i), gs...))
			}
			b := setup(t, inbox.Config{Approvers: approvers, ListLimit: limit})
			type expect struct {
				key, group string
				at         time.Time // the expiry of a call awaiting, the decision of one decided
			}
			var awaiting, decided []expect
			for range rng.IntN(25) {
				g := groups[rng.IntN(len(groups))]
				row := b.awaitingFor(t, g, fmt.Sprintf(`{"n":%d}`, rng.IntN(1000)), time.Duration(1+rng.IntN(5))*time.Minute)
				if rng.IntN(3) > 0 {
					awaiting = append(awaiting, expect{row.Key, g, row.ApprovalExpiresAt})
					continue
				}
				d, err := b.appr.Decide(context.Background(), row.Key, ledger.Decision{Approve: rng.IntN(2) == 0, By: "cli", Reason: "r"})
				if err != nil {
					t.Fatal(err)
				}
				decided = append(decided, expect{row.Key, g, d.LastDecision().At})
			}
			slices.SortFunc(awaiting, func(a, b expect) int { return cmpThen(a.at.Compare(b.at), a.key, b.key) })
			slices.SortFunc(decided, func(a, b expect) int { return cmpThen(b.at.Compare(a.at), a.key, b.key) })
			for i, a := range approvers {
				br := b.browser(t)
				br.login(fmt.Sprintf("token-%d-0123456789abcdef", i))
				for _, c := range []struct {
					path string
					all  []expect
				}{{"/api/pending", awaiting}, {"/api/history", decided}} {
					var want []string
					for _, e := range c.all {
						if a.Decides(e.group) {
							want = append(want, e.key)
						}
					}
					more := max(0, len(want)-limit)
					want = want[:len(want)-more]
					l := br.list(c.path)
					if got := keysOf(l); got != strings.Join(want, ",") || l.More != int64(more) {
						t.Fatalf("%s of %s (groups %v, limit %d):\n got %s and %d more\nwant %s and %d more",
							c.path, a.Name, a.Groups, limit, got, l.More, strings.Join(want, ","), more)
					}
				}
			}
		})
	}
}

// cmpThen is c, or the order of the keys a and b when c is 0.
func cmpThen(c int, a, b string) int {
	if c != 0 {
		return c
	}
	return strings.Compare(a, b)
}
