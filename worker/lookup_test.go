package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestLookupAnswersWhatTheLedgerKnows: over NATS, without database access,
// an agent asks whether a call already happened: completed (with its
// output), in flight, indeterminate (with why), or unknown; a malformed key
// is refused with the service's error.
func TestLookupAnswersWhatTheLedgerKnows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"paid":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 5 * time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := startWorker(t, reg, worker.Config{})
	svc, err := worker.ServeLookup(js.Conn(), store, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()

	done := &jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_done", Args: json.RawMessage(`{"a":1}`)}
	if r, err := client.PublishAndAwait(actx, done); err != nil || r.Status != jobs.StatusOK {
		t.Fatalf("%+v %v", r, err)
	}
	doneKey, _ := done.Key()

	claim := func(tool, id string) ledger.Row {
		j := &jobs.Job{ConversationID: "c", TurnIndex: 2, Tool: tool, ToolUseID: id, Args: json.RawMessage(`{"b":2}`)}
		m, _ := j.Call().Material()
		key, _ := j.Key()
		res, err := store.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: "c", TurnIndex: 2, Tool: tool, ArgsDigest: m.ArgsDigest(),
			Owner: "test", Lease: time.Minute, ToolUseID: id, Token: id}})
		if err != nil || !res[0].Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		return res[0].Row
	}
	inFlight := claim("pay", "toolu_flight")
	lost := claim("ticket", "toolu_lost")
	if err := store.MarkIndeterminate(ctx, lost.Fence(), ledger.ErrorInfo{Code: "reset", Message: "connection reset after the request was sent"}); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		key, state string
		check      func(*jobs.Lookup) bool
	}{
		{doneKey, jobs.LookupCompleted, func(l *jobs.Lookup) bool {
			return string(l.Output) == `{"paid":true}` && l.FirstToolUseID == "toolu_done" && l.Attempt == 1
		}},
		{inFlight.Key, jobs.LookupInFlight, func(l *jobs.Lookup) bool { return l.LeaseRemainingMS > 0 && l.Output == nil }},
		{lost.Key, jobs.LookupIndeterminate, func(l *jobs.Lookup) bool { return l.Error != nil && l.Error.Code == "reset" }},
		{"0123456789abcdef0123456789abcdef", jobs.LookupUnknown, func(l *jobs.Lookup) bool { return l.Attempt == 0 }},
	} {
		l, err := client.Lookup(actx, c.key)
		if err != nil || l.Key != c.key || l.State != c.state || !c.check(l) {
			t.Errorf("lookup %s: %+v %v, want %s", c.key, l, err, c.state)
		}
	}
	if _, err := client.Lookup(actx, "not a key"); !errors.Is(err, jobs.ErrLookupRefused) {
		t.Errorf("a malformed key: %v, want ErrLookupRefused", err)
	}
}

// TestLookupShowsACallAwaitingApproval: a later turn asks by key about a
// call that waits for a person: awaiting_approval, with what was asked and
// until when; once denied, failed with the decision.
func TestLookupShowsACallAwaitingApproval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"paid":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Approval: &tools.Approval{Group: "finance"}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := startWorker(t, reg, worker.Config{})
	svc, err := worker.ServeLookup(js.Conn(), store, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	j := &jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_ask", Args: json.RawMessage(`{"amount_cents":90000}`)}
	pending, err := client.PublishAndAwait(actx, j)
	if err != nil || pending.Status != jobs.StatusAwaitingApproval {
		t.Fatalf("%+v %v", pending, err)
	}
	l, err := client.Lookup(actx, pending.Key)
	if err != nil || l.State != jobs.LookupAwaitingApproval || l.Approval == nil || l.Approval.Group != "finance" ||
		string(l.Approval.Args) != `{"amount_cents":90000}` || l.Approval.ArgsDigest != pending.Approval.ArgsDigest ||
		!l.Approval.ExpiresAt.Equal(pending.Approval.ExpiresAt) || l.Approval.Decision != "" || l.Output != nil {
		t.Fatalf("lookup of a call awaiting approval: %+v %+v %v", l, l.Approval, err)
	}
	if _, err := store.Decide(ctx, pending.Key, ledger.Decision{By: "bob", Reason: "no", Group: "finance"}); err != nil {
		t.Fatal(err)
	}
	l, err = client.Lookup(actx, pending.Key)
	if err != nil || l.State != jobs.LookupFailed || l.Error == nil || l.Error.Code != ledger.CodeApprovalDenied ||
		l.Approval == nil || l.Approval.Decision != "denied" || l.Approval.DecidedBy != "bob" {
		t.Fatalf("lookup of a denied call: %+v %+v %v", l, l.Approval, err)
	}
}
