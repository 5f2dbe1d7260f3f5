package approvals_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// TestATenantsCallIsNotDecidedOnTheDefaultTenantsSubjectWithoutTenants:
// docs/tenants.md: "only a decision on that tenant's subject decides it (on
// another tenant's subject the answer is 404, as for a key that does not
// exist)". A consumer run without --tenants on a ledger shared with
// tenants (the case approvals.TenantOf guards its announcements against)
// serves toolq.decide.<group>: acme's call must not be decided there, by
// the default tenant's approver of the group.
func TestATenantsCallIsNotDecidedOnTheDefaultTenantsSubjectWithoutTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, store := serving(t) // a decision service without tenants configured
	key := awaitingCall(t, store, jobs.Call{Tenant: "acme", ConversationID: "c", TurnIndex: 1, Tool: "pay", Args: json.RawMessage(`{"amount_cents":90000}`)}, time.Hour)
	r, code := decideOverNATS(t, nc, jobs.DecisionRequest{Key: key, Decision: "approve", By: "default-tenant-approver", Reason: "ok"})
	st, _ := store.ApprovalStatusOf(ctx, key)
	if code != "404" || st != ledger.ApprovalAwaiting {
		t.Fatalf("acme's call decided on toolq.decide.finance (the default tenant's subject): code %q, reply status %q, ledger approval %q; want 404 and the call still awaiting", code, r.Status, st)
	}
}

// TestWithTenantsASecondDecisionOnAnApprovedCallSaysWhatStands:
// docs/approvals.md: "A decision for a call that is no longer waiting is
// refused, and the answer names the decision that stands ("was approved by
// alice at …")" and the table: 409, no longer waiting, status says what
// stands. With tenants configured too, on the default tenant's subject and
// a tenant's, after an approval whose call has not run yet (its row
// released, which Get does not return): 409 "approved", not the 404 of a
// key that does not exist (as TestARefusedDecisionsReplySaysWhatStands
// without tenants).
func TestWithTenantsASecondDecisionOnAnApprovedCallSaysWhatStands(t *testing.T) {
	t.Parallel()
	nc, store := serving(t, "acme")
	for _, tenant := range []string{"", "acme"} {
		key := awaitingCall(t, store, jobs.Call{Tenant: tenant, ConversationID: "c", TurnIndex: 1, Tool: "pay", Args: json.RawMessage(`{"amount_cents":90000}`)}, time.Hour)
		subject := jobs.TenantDecideSubject(tenant, "finance")
		decide := func(decision string) (jobs.DecisionReply, string) {
			return decideOn(t, nc, subject, jobs.DecisionRequest{Key: key, Decision: decision, By: "alice", Reason: "r"})
		}
		if r, code := decide("approve"); code != "" || r.Status != "approved" {
			t.Fatalf("tenant %q: the first decision: %+v %s", tenant, r, code)
		}
		if r, code := decide("deny"); code != "409" || r.Status != "approved" {
			t.Errorf("tenant %q (on %s): a second decision after an approval (call not run yet): code %q, status %q (want 409, approved); %+v",
				tenant, subject, code, r.Status, r.Error)
		}
	}
}
