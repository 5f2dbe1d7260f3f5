package approvals_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// turns numbers the calls awaiting makes, so that each has a key of its own.
var turns atomic.Int64

// awaiting makes a call of the default tenant await approval by finance for
// ttl, and returns its key: a real call's, which the decision service finds
// to be the default tenant's.
func awaiting(t *testing.T, store *ledger.Store, ttl time.Duration) string {
	t.Helper()
	return awaitingCall(t, store, jobs.Call{ConversationID: "c", TurnIndex: turns.Add(1), Tool: "pay", Args: json.RawMessage(`{"amount_cents":90000}`)}, ttl)
}

// awaitingCall claims call and makes it await approval by finance for ttl,
// and returns its key.
func awaitingCall(t *testing.T, store *ledger.Store, call jobs.Call, ttl time.Duration) string {
	t.Helper()
	ctx := context.Background()
	key, err := call.Key()
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: call.ConversationID, TurnIndex: call.TurnIndex, Tool: call.Tool, ArgsDigest: "d",
		ToolUseID: "toolu_1", Owner: "t", Lease: time.Minute, Token: "tok-" + key}})
	if err != nil || !got[0].Claimed {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := store.AwaitApproval(ctx, got[0].Row.Fence(), ledger.ApprovalInfo{Args: call.Args, Group: "finance", TTL: ttl}, "toolu_1"); err != nil {
		t.Fatal(err)
	}
	return key
}

// decideOverNATS sends req to the decision service of the default tenant's
// finance group.
func decideOverNATS(t *testing.T, nc *nats.Conn, req jobs.DecisionRequest) (jobs.DecisionReply, string) {
	t.Helper()
	return decideOn(t, nc, jobs.DecideSubject("finance"), req)
}

// decideOn sends req on subject and returns the reply and its service
// error code ("" for none).
func decideOn(t *testing.T, nc *nats.Conn, subject string, req jobs.DecisionRequest) (jobs.DecisionReply, string) {
	t.Helper()
	body, _ := json.Marshal(req)
	msg, err := nc.Request(subject, body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var reply jobs.DecisionReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		t.Fatalf("%s: %v", msg.Data, err)
	}
	return reply, msg.Header.Get("Nats-Service-Error-Code")
}

// broker is a broker with the streams of the default tenant and tenants,
// and a SQLite ledger.
func broker(t *testing.T, tenants ...string) (*nats.Conn, jetstream.JetStream, *ledger.Store) {
	t.Helper()
	ctx := context.Background()
	n := testenv.StartNATS(t)
	nc := n.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{Tenants: tenants}); err != nil {
		t.Fatal(err)
	}
	store, err := ledger.OpenSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return nc, js, store
}

// serving is a broker and a SQLite ledger with the decision service of
// tenants (and the default tenant) answering on them.
func serving(t *testing.T, tenants ...string) (*nats.Conn, *ledger.Store) {
	t.Helper()
	nc, js, store := broker(t, tenants...)
	svc, err := approvals.New(approvals.Config{Ledger: store, JS: js, Tenants: tenants})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := svc.Serve(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Stop() })
	return nc, store
}

// TestARefusedDecisionsReplySaysWhatStands: a decision for a call that is
// no longer waiting is refused (409), and its reply's status is the
// approval as it stands ("approved", "denied", "expired"): after an
// approval whose call has not run yet, "approved"; for a call whose ttl
// ran out before the sweep expired it, not "awaiting".
func TestARefusedDecisionsReplySaysWhatStands(t *testing.T) {
	t.Parallel()
	nc, store := serving(t)

	approved := awaiting(t, store, time.Hour)
	if r, code := decideOverNATS(t, nc, jobs.DecisionRequest{Key: approved, Decision: "approve", By: "alice", Reason: "ok"}); code != "" || r.Status != "approved" {
		t.Fatalf("the first decision: %+v %s", r, code)
	}
	r, code := decideOverNATS(t, nc, jobs.DecisionRequest{Key: approved, Decision: "deny", By: "bob", Reason: "no"})
	if code != "409" || r.Status != "approved" {
		t.Errorf("a second decision after an approval: code %q, status %q (want 409, approved); %+v", code, r.Status, r.Error)
	}

	expired := awaiting(t, store, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	r, code = decideOverNATS(t, nc, jobs.DecisionRequest{Key: expired, Decision: "approve", By: "alice", Reason: "ok"})
	if code != "409" || r.Status == "awaiting" {
		t.Errorf("a decision after the ttl, before the sweep: code %q, status %q (refused as not awaiting, yet said awaiting); %+v", code, r.Status, r.Error)
	}
}

// TestADenialAfterTheTTLIsRefusedAsExpired: a denial, as an approval, of a
// call whose ttl ran out before the sweep expired it is refused as expired
// (the deny statement's expiry condition).
func TestADenialAfterTheTTLIsRefusedAsExpired(t *testing.T) {
	t.Parallel()
	nc, store := serving(t)
	key := awaiting(t, store, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	r, code := decideOverNATS(t, nc, jobs.DecisionRequest{Key: key, Decision: "deny", By: "bob", Reason: "no"})
	if code != "409" || r.Status != "expired" {
		t.Fatalf("a denial after the ttl, before the sweep: code %q, status %q (want 409, expired)", code, r.Status)
	}
}

// TestAMalformedDecisionIsRefusedAndDecidesNothing: what is not a decision
// (not JSON, unknown fields, a bad key, another verb, no reason, two
// decisions in one request) is refused 400 and the call still awaits.
func TestAMalformedDecisionIsRefusedAndDecidesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, store := serving(t)
	key := awaiting(t, store, time.Hour)
	for _, body := range []string{
		`not json`,
		`{"key":"` + key + `","decision":"approve","by":"a","reason":"r","extra":1}`,
		`{"key":"K","decision":"approve","by":"a","reason":"r"}`,
		`{"key":"` + key + `","decision":"maybe","by":"a","reason":"r"}`,
		`{"key":"` + key + `","decision":"approve","by":"a","reason":" "}`,
		`{"key":"` + key + `","decision":"approve","by":"","reason":"r"}`,
		// Two JSON values, an approval then a denial: the first alone must not be taken.
		`{"key":"` + key + `","decision":"approve","by":"a","reason":"r"}{"key":"` + key + `","decision":"deny","by":"a","reason":"r"}`,
	} {
		msg, err := nc.Request(jobs.DecideSubject("finance"), []byte(body), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var reply jobs.DecisionReply
		if code := msg.Header.Get("Nats-Service-Error-Code"); code != "400" || json.Unmarshal(msg.Data, &reply) != nil || reply.Error == nil {
			t.Errorf("%s: code %q, reply %s", body, code, msg.Data)
		}
	}
	if row, err := store.Get(ctx, key); err != nil || row.State != ledger.AwaitingApproval {
		t.Fatalf("after malformed decisions: %+v %v", row.State, err)
	}
}
