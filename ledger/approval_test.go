package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

var payment = ledger.ApprovalInfo{Args: json.RawMessage(`{"amount_cents":90000,"to":"acct_1"}`), Group: "finance", TTL: time.Hour}

// awaiting claims a fresh key and turns it to awaiting_approval.
func awaiting(t *testing.T, s *ledger.Store, info ledger.ApprovalInfo) (ledger.Claim, ledger.Row) {
	t.Helper()
	c := newClaim(time.Minute)
	c.Token = newToken()
	row := mustClaim(t, s, c)
	got, err := s.AwaitApproval(context.Background(), row.Fence(), info, c.ToolUseID)
	if err != nil {
		t.Fatal(err)
	}
	return c, got
}

func TestAnApprovalWaitsInTheLedgerAndADuplicateJoinsIt(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c, row := awaiting(t, s, payment)
		if row.State != ledger.AwaitingApproval || row.ApprovalStatus != ledger.ApprovalAwaiting || row.Approval == nil ||
			string(row.Approval.Args) != string(payment.Args) || row.Approval.Group != "finance" || row.Approval.TTL != time.Hour {
			t.Fatalf("awaiting row: %+v %+v", row, row.Approval)
		}
		if d := time.Until(row.ApprovalExpiresAt); d < 59*time.Minute || d > 61*time.Minute {
			t.Fatalf("expires in %s, want an hour", d)
		}
		if !slices.Equal(row.Waiters, []string{c.ToolUseID}) {
			t.Fatalf("waiters %v", row.Waiters)
		}
		// A duplicate's claim finds the awaiting row: it is not claimed again.
		dup := c
		dup.ToolUseID, dup.Token = "toolu_dup", newToken()
		if r := claimOne(t, s, dup); r.Claimed || r.Row.State != ledger.AwaitingApproval {
			t.Fatalf("duplicate claim: %+v", r)
		}
		for range 2 { // the same waiter twice is one
			if row, _ = s.AddWaiter(ctx, c.Key, "toolu_dup"); !slices.Equal(row.Waiters, []string{c.ToolUseID, "toolu_dup"}) {
				t.Fatalf("waiters %v", row.Waiters)
			}
		}
		counts, err := s.Counts(ctx)
		if err != nil || counts[string(ledger.AwaitingApproval)] != 1 {
			t.Fatalf("counts %v %v", counts, err)
		}
		listed, err := s.List(ctx, ledger.Filter{State: ledger.AwaitingApproval})
		if err != nil || len(listed) != 1 || listed[0].Key != c.Key {
			t.Fatalf("list awaiting: %v %v", listed, err)
		}
		if err := s.ApprovalPublished(ctx, row); err != nil {
			t.Fatal(err)
		}
		if got := mustGet(t, s, c.Key); !got.Approval.Published || string(got.Approval.Args) != string(payment.Args) {
			t.Fatalf("after ApprovalPublished: %+v", got.Approval)
		}
		// The holder's claim ended with the request: its writes are fenced.
		isErr(t, s.Complete(ctx, row.Fence(), json.RawMessage(`{}`)), ledger.ErrFenced)
	})
}

func TestAnApprovedCallIsReleasedToRunOnceWithoutAskingAgain(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c, row := awaiting(t, s, payment)
		decided, err := s.Decide(ctx, c.Key, ledger.Decision{Approve: true, By: "alice", Reason: "known customer", Group: "finance", Digest: row.ArgsDigest})
		if err != nil {
			t.Fatal(err)
		}
		// Approved and not claimed yet: its job is to be published.
		if rows, err := s.UnansweredApprovals(ctx, 0, "", 10); err != nil || len(rows) != 1 {
			t.Fatalf("an approved call not claimed since: %v %v", rows, err)
		}
		if decided.ApprovalStatus != ledger.ApprovalApproved {
			t.Fatalf("decided: %+v", decided)
		}
		ev := decided.LastDecision()
		if ev == nil || ev.By != "alice" || ev.Reason != "known customer" || ev.Decision != "approved" || ev.Digest != row.ArgsDigest ||
			ev.Group != "finance" || ev.From != ledger.AwaitingApproval || time.Since(ev.At) > time.Minute {
			t.Fatalf("decision event %+v", ev)
		}
		// Released: the next claim runs it, at the next attempt, approved.
		again := c
		again.Token = newToken()
		run := mustClaim(t, s, again)
		if run.Attempt != 2 || run.ApprovalStatus != ledger.ApprovalApproved || len(run.Waiters) != 1 {
			t.Fatalf("claimed after approval: %+v", run)
		}
		// Released again (not sent), it is still approved, and its job is
		// JetStream's again: the sweep leaves it alone.
		if err := s.Release(ctx, run.Fence()); err != nil {
			t.Fatal(err)
		}
		if rows, err := s.UnansweredApprovals(ctx, 0, "", 10); err != nil || len(rows) != 0 {
			t.Fatalf("an approved call released after a claim is unanswered: %v %v", rows, err)
		}
		again.Token = newToken()
		run = mustClaim(t, s, again)
		if run.ApprovalStatus != ledger.ApprovalApproved {
			t.Fatalf("claimed after a release: %+v", run)
		}
		// A second decision is refused, naming the one that stood.
		_, err = s.Decide(ctx, c.Key, ledger.Decision{By: "bob", Reason: "no"})
		if !errors.Is(err, ledger.ErrNotAwaiting) || !strings.Contains(err.Error(), "approved by alice") {
			t.Fatalf("second decision: %v", err)
		}
		// Settled, its waiters are answered once.
		if err := s.Complete(ctx, run.Fence(), json.RawMessage(`{"paid":true}`)); err != nil {
			t.Fatal(err)
		}
		rows, err := s.UnansweredApprovals(ctx, 0, "", 10)
		if err != nil || len(rows) != 1 || rows[0].Key != c.Key {
			t.Fatalf("unanswered: %v %v", rows, err)
		}
		if err := s.WaitersAnswered(ctx, c.Key); err != nil {
			t.Fatal(err)
		}
		if rows, _ = s.UnansweredApprovals(ctx, 0, "", 10); len(rows) != 0 || mustGet(t, s, c.Key).Waiters != nil {
			t.Fatalf("after answering: %v", rows)
		}
	})
}

func TestGetOrApprovedReadsAnApprovedCallNotRunYetAndNoOtherReleasedRow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c, row := awaiting(t, s, payment)
		if got, err := s.GetOrApproved(ctx, c.Key); err != nil || got.State != ledger.AwaitingApproval {
			t.Fatalf("awaiting: %+v %v", got, err)
		}
		if _, err := s.Decide(ctx, c.Key, ledger.Decision{Approve: true, By: "alice", Reason: "ok", Group: "finance", Digest: row.ArgsDigest}); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetOrApproved(ctx, c.Key)
		if err != nil || got.State != ledger.Released || got.ApprovalStatus != ledger.ApprovalApproved || got.Approval == nil {
			t.Fatalf("approved, not run yet: %+v %v", got, err)
		}
		again := c
		again.Token = newToken()
		run := mustClaim(t, s, again)
		if got, err := s.GetOrApproved(ctx, c.Key); err != nil || got.State != ledger.InFlight || got.Attempt != run.Attempt {
			t.Fatalf("approved and claimed: %+v %v", got, err)
		}
		// A released row of a call no person approved is no row, as for Get.
		other := newClaim(time.Minute)
		other.Token = newToken()
		released := mustClaim(t, s, other)
		if err := s.Release(ctx, released.Fence()); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetOrApproved(ctx, other.Key); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("released, never approved: %v", err)
		}
		if _, err := s.GetOrApproved(ctx, "no-such-key"); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("no row: %v", err)
		}
	})
}

func TestADeniedCallFailsAndNeverRuns(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c, _ := awaiting(t, s, payment)
		decided, err := s.Decide(ctx, c.Key, ledger.Decision{By: "bob", Reason: "unknown payee"})
		if err != nil {
			t.Fatal(err)
		}
		if decided.State != ledger.Failed || decided.ApprovalStatus != ledger.ApprovalDenied || decided.Error == nil ||
			decided.Error.Code != ledger.CodeApprovalDenied || !strings.Contains(decided.Error.Message, "unknown payee") {
			t.Fatalf("denied: %+v %+v", decided, decided.Error)
		}
		again := c
		again.Token = newToken()
		if r := claimOne(t, s, again); r.Claimed || r.Row.State != ledger.Failed {
			t.Fatalf("a claim after the denial: %+v", r)
		}
		_, err = s.AddWaiter(ctx, c.Key, "toolu_late")
		if !errors.Is(err, ledger.ErrNotAwaiting) || !strings.Contains(err.Error(), "denied by bob") {
			t.Fatalf("a waiter after the denial: %v", err)
		}
	})
}

func TestADecisionFromAnotherGroupOrForOtherArgsIsRefused(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		c, _ := awaiting(t, s, payment)
		_, err := s.Decide(ctx, c.Key, ledger.Decision{Approve: true, By: "mallory", Reason: "x", Group: "support"})
		if !errors.Is(err, ledger.ErrDecisionRefused) || !strings.Contains(err.Error(), `"finance"`) {
			t.Fatalf("another group: %v", err)
		}
		_, err = s.Decide(ctx, c.Key, ledger.Decision{Approve: true, By: "alice", Reason: "x", Digest: "other"})
		if !errors.Is(err, ledger.ErrDecisionRefused) {
			t.Fatalf("another digest: %v", err)
		}
		for _, d := range []ledger.Decision{{By: "alice"}, {Reason: "x"},
			{By: strings.Repeat("a", ledger.MaxDecisionBy+1), Reason: "x"}, {By: "alice", Reason: strings.Repeat("x", ledger.MaxDecisionReason+1)}} {
			if _, err := s.Decide(ctx, c.Key, d); !errors.Is(err, ledger.ErrInvalidDecision) {
				t.Fatalf("a decision without who or why, or too long to travel with the call, was not refused: %d and %d bytes: %v", len(d.By), len(d.Reason), err)
			}
		}
		if row := mustGet(t, s, c.Key); row.State != ledger.AwaitingApproval {
			t.Fatalf("after refused decisions: %s", row.State)
		}
		_, err = s.Decide(ctx, "no-such-key", ledger.Decision{By: "a", Reason: "b"})
		isErr(t, err, ledger.ErrNotFound)
		plain := mustClaim(t, s, newClaim(time.Minute))
		_, err = s.Decide(ctx, plain.Key, ledger.Decision{By: "a", Reason: "b"})
		if !errors.Is(err, ledger.ErrNotAwaiting) || !strings.Contains(err.Error(), "never needed approval") {
			t.Fatalf("a call that never needed approval: %v", err)
		}
	})
}

// Approvers deciding at once: exactly one decision stands, and every other
// is told which.
func TestOfConcurrentDecisionsExactlyOneStands(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		for range 5 {
			c, _ := awaiting(t, s, payment)
			var wg sync.WaitGroup
			var mu sync.Mutex
			won := []string{}
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					by := "approver" + string(rune('a'+i))
					_, err := s.Decide(context.Background(), c.Key, ledger.Decision{Approve: i%2 == 0, By: by, Reason: "r"})
					switch {
					case err == nil:
						mu.Lock()
						won = append(won, by)
						mu.Unlock()
					case !errors.Is(err, ledger.ErrNotAwaiting):
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			if len(won) != 1 {
				t.Fatalf("%d decisions stood: %v", len(won), won)
			}
			// The row says the one that stood.
			_, err := s.Decide(context.Background(), c.Key, ledger.Decision{By: "late", Reason: "r"})
			if !errors.Is(err, ledger.ErrNotAwaiting) || !strings.Contains(err.Error(), "by "+won[0]+" ") {
				t.Fatalf("after the race: %v, want the decision of %s", err, won[0])
			}
		}
	})
}

func TestAnUndecidedCallExpiresAndNeverRuns(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		short := payment
		short.TTL = 200 * time.Millisecond
		c, _ := awaiting(t, s, short)
		long, _ := awaiting(t, s, payment)
		if rows, err := s.ExpireApprovals(ctx, 10); err != nil || len(rows) != 0 {
			t.Fatalf("expired before the ttl: %v %v", rows, err)
		}
		var expired []ledger.Row
		testenv.Eventually(t, 10*time.Second, "the approval to expire", func() bool {
			rows, err := s.ExpireApprovals(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			expired = append(expired, rows...)
			return len(expired) > 0
		})
		if len(expired) != 1 || expired[0].Key != c.Key || expired[0].State != ledger.Failed ||
			expired[0].ApprovalStatus != ledger.ApprovalExpired || expired[0].Error.Code != ledger.CodeApprovalExpired {
			t.Fatalf("expired: %+v", expired)
		}
		if ev := expired[0].LastDecision(); ev == nil || ev.Action != "expire" {
			t.Fatalf("expiry event %+v", ev)
		}
		_, err := s.Decide(ctx, c.Key, ledger.Decision{Approve: true, By: "alice", Reason: "late"})
		if !errors.Is(err, ledger.ErrNotAwaiting) || !strings.Contains(err.Error(), "expired") {
			t.Fatalf("a decision after the expiry: %v", err)
		}
		if row := mustGet(t, s, long.Key); row.State != ledger.AwaitingApproval {
			t.Fatalf("the other call: %s", row.State)
		}
		// Expired rows still have their waiters to answer.
		rows, err := s.UnansweredApprovals(ctx, 0, "", 10)
		if err != nil || len(rows) != 1 || rows[0].Key != c.Key {
			t.Fatalf("unanswered: %v %v", rows, err)
		}
	})
}

// A decision on an expired call that the sweep has not reached yet is
// refused as expired, an approval as a denial: the expiry is the
// database's clock, not the sweep's.
func TestADecisionAfterTheExpiryIsRefusedBeforeTheSweep(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		short := payment
		short.TTL = 100 * time.Millisecond
		approved, _ := awaiting(t, s, short)
		denied, _ := awaiting(t, s, short)
		time.Sleep(300 * time.Millisecond)
		for _, d := range []struct {
			key     string
			approve bool
		}{{approved.Key, true}, {denied.Key, false}} {
			_, err := s.Decide(context.Background(), d.key, ledger.Decision{Approve: d.approve, By: "alice", Reason: "late"})
			if !errors.Is(err, ledger.ErrNotAwaiting) || !strings.Contains(err.Error(), "expired at") {
				t.Fatalf("decision (approve %v) after the expiry: %v", d.approve, err)
			}
		}
	})
}

// The args of a call awaiting approval are kept byte for byte: the
// canonical JSON whose digest an approver checks, <, > and & included.
func TestApprovalArgsAreKeptByteForByte(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		info := payment
		info.Args = json.RawMessage("{\"memo\":\"<b>a & b</b>\",\"note\":\"\u2028\"}") // a raw U+2028
		c, row := awaiting(t, s, info)
		if string(row.Approval.Args) != string(info.Args) {
			t.Fatalf("await approval kept %s, want %s", row.Approval.Args, info.Args)
		}
		if err := s.ApprovalPublished(context.Background(), row); err != nil {
			t.Fatal(err)
		}
		if got := mustGet(t, s, c.Key); string(got.Approval.Args) != string(info.Args) {
			t.Fatalf("after ApprovalPublished: %s, want %s", got.Approval.Args, info.Args)
		}
	})
}

func TestListSelectsCallsByApproval(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		pending, _ := awaiting(t, s, payment)
		denied, _ := awaiting(t, s, payment)
		if _, err := s.Decide(ctx, denied.Key, ledger.Decision{By: "bob", Reason: "no"}); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, s, newClaim(time.Minute)) // never needed approval
		keys := func(f ledger.Filter) []string {
			rows, err := s.List(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, r := range rows {
				out = append(out, r.Key)
			}
			slices.Sort(out)
			return out
		}
		want := []string{pending.Key, denied.Key}
		slices.Sort(want)
		if got := keys(ledger.Filter{Approval: "any"}); !slices.Equal(got, want) {
			t.Fatalf("approval any: %v, want %v", got, want)
		}
		if got := keys(ledger.Filter{Approval: "denied"}); !slices.Equal(got, []string{denied.Key}) {
			t.Fatalf("approval denied: %v", got)
		}
	})
}

// TestUnansweredApprovalsFindsADecisionBehindAHundredApprovedCallsHandedBack:
// a downstream outage hands back a hundred approved calls after their
// claim (released, their jobs with JetStream and its delivery limit: not
// the sweep's). A call denied after them, its decision in the ledger alone
// (the CLI with NATS out), must still be among the unanswered approvals
// the sweep asks for (it asks for 100).
func TestUnansweredApprovalsFindsADecisionBehindAHundredApprovedCallsHandedBack(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		for range 100 {
			c, _ := awaiting(t, s, payment)
			if _, err := s.Decide(ctx, c.Key, ledger.Decision{Approve: true, By: "alice", Reason: "ok"}); err != nil {
				t.Fatal(err)
			}
			run := c
			run.Token = newToken()
			// The approved call's run, handed back: its downstream refused it, nothing was sent.
			row := mustClaim(t, s, run)
			if err := s.Release(ctx, row.Fence()); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(5 * time.Millisecond)
		c, _ := awaiting(t, s, payment)
		if _, err := s.Decide(ctx, c.Key, ledger.Decision{By: "bob", Reason: "no"}); err != nil {
			t.Fatal(err)
		}
		rows, err := s.UnansweredApprovals(ctx, 0, "", 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Key == c.Key {
				return
			}
		}
		t.Fatalf("the denied call is not among the %d unanswered approvals: its waiters are never told", len(rows))
	})
}

// The unanswered approvals come in the order of their keys, a page at a
// time from the first after the key given: a reader pages on past calls
// it cannot answer.
func TestUnansweredApprovalsPageOnPastTheKeyGiven(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		var keys []string
		for range 3 {
			c, _ := awaiting(t, s, payment)
			if _, err := s.Decide(ctx, c.Key, ledger.Decision{By: "bob", Reason: "no"}); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, c.Key)
		}
		slices.Sort(keys)
		var got []string
		after := ""
		for range 3 {
			rows, err := s.UnansweredApprovals(ctx, 0, after, 2)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				got = append(got, r.Key)
			}
			if len(rows) < 2 {
				break
			}
			after = rows[len(rows)-1].Key
		}
		if !slices.Equal(got, keys) {
			t.Fatalf("pages of 2 read %v, want every unanswered call once, by key: %v", got, keys)
		}
	})
}

// A claim records its call's tenant, and the row keeps it through a
// release and the claim after.
func TestARowKeepsItsCallsTenant(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		c := newClaim(time.Minute)
		c.Tenant, c.Token = "acme", newToken()
		row := mustClaim(t, s, c)
		if row.Tenant != "acme" || mustGet(t, s, c.Key).Tenant != "acme" {
			t.Fatalf("claimed row's tenant %q", row.Tenant)
		}
		if err := s.Release(context.Background(), row.Fence()); err != nil {
			t.Fatal(err)
		}
		c.Token = newToken()
		if again := mustClaim(t, s, c); again.Tenant != "acme" {
			t.Fatalf("after a release: %q", again.Tenant)
		}
		if plain := mustClaim(t, s, newClaim(time.Minute)); plain.Tenant != "" {
			t.Fatalf("the default tenant's row: %q", plain.Tenant)
		}
	})
}
