package worker_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// votes are args whose key changed with the member-order fix: 👎 U+1F44E
// and 👍 U+1F44D share their high surrogate, so the legacy order kept them
// as written, 👎 first.
const votes = `{"poll":"p-7","votes":{"👎":3,"👍":12}}`

// sentKeys records the Idempotency-Key of every call a tool made.
type sentKeys struct {
	mu   sync.Mutex
	keys []string
}

func (s *sentKeys) add(k string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, k)
}

func (s *sentKeys) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// legacyMaterial is what a consumer from before the fix derived for call:
// its material and key.
func legacyMaterial(t *testing.T, call jobs.Call) (legacy jobs.Material, key string) {
	t.Helper()
	m, err := call.Material()
	if err != nil {
		t.Fatal(err)
	}
	legacy, ok := m.Legacy()
	if !ok || legacy.Key() == m.Key() {
		t.Fatalf("args %s: no legacy key apart from %s", call.Args, m.Key())
	}
	return legacy, legacy.Key()
}

// claimAsBeforeTheFix writes the claim a consumer from before the fix made
// for call: under its legacy key and with its legacy material.
func claimAsBeforeTheFix(t *testing.T, store *ledger.Store, call jobs.Call, toolUseID string, lease time.Duration) ledger.Row {
	t.Helper()
	legacy, key := legacyMaterial(t, call)
	res, err := store.Claim(context.Background(), []ledger.Claim{{Key: key, ConversationID: call.ConversationID, TurnIndex: call.TurnIndex,
		Tool: call.Tool, Ordinal: call.Ordinal, ArgsDigest: legacy.ArgsDigest(), ToolUseID: toolUseID, Owner: "consumer-before-the-fix",
		Lease: lease, Token: "token-before-the-fix"}})
	if err != nil || !res[0].Claimed {
		t.Fatalf("claim under the legacy key: %+v, %v", res, err)
	}
	return res[0].Row
}

// publishWithKey publishes job as a publisher would that derived key for
// it: a publisher from before the fix sends the legacy key.
func publishWithKey(t *testing.T, js jetstream.JetStream, j *jobs.Job, key string) {
	t.Helper()
	j.Version = jobs.Version
	body, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(jobs.JobSubject(j.Tool))
	msg.Data = body
	msg.Header.Set(jobs.HeaderKey, key)
	if _, err := js.PublishMsg(context.Background(), msg, jetstream.WithMsgID(jobs.JobMsgID(key, j.ToolUseID))); err != nil {
		t.Fatal(err)
	}
}

// TestRowsUnderTheKeyBeforeTheMemberOrderFixAnswerAfterIt is the upgrade:
// rows that a consumer from before the fix wrote under a call's legacy key
// answer the same call published after it, with no second effect: a
// settled row answers it, an in-flight one is awaited, an expired one is
// taken over with the legacy key sent downstream (keyed) or left
// indeterminate (unkeyed). A job from a publisher before the fix, which
// carries the legacy key, is not refused as key_mismatch; one from a
// publisher after it, which carries the new key, finds the same row.
func TestRowsUnderTheKeyBeforeTheMemberOrderFixAnswerAfterIt(t *testing.T) {
	t.Parallel()
	type setup func(t *testing.T, store *ledger.Store, call jobs.Call)
	completed := func(t *testing.T, store *ledger.Store, call jobs.Call) {
		row := claimAsBeforeTheFix(t, store, call, "toolu_before", time.Minute)
		if err := store.Complete(context.Background(), row.Fence(), json.RawMessage(`{"receipt":"before"}`)); err != nil {
			t.Fatal(err)
		}
	}
	expired := func(t *testing.T, store *ledger.Store, call jobs.Call) {
		claimAsBeforeTheFix(t, store, call, "toolu_before", time.Millisecond)
	}
	settledWhileAwaited := func(t *testing.T, store *ledger.Store, call jobs.Call) {
		row := claimAsBeforeTheFix(t, store, call, "toolu_before", time.Minute)
		time.AfterFunc(500*time.Millisecond, func() {
			if err := store.Complete(context.Background(), row.Fence(), json.RawMessage(`{"receipt":"before"}`)); err != nil {
				t.Error(err)
			}
		})
	}
	for _, tc := range []struct {
		name       string
		class      tools.Class
		rowBefore  setup
		oldHeader  bool        // published by a publisher from before the fix
		wantStatus jobs.Status // the result's status
		wantLegacy int         // calls sent downstream under the legacy key
		wantNew    int         // calls sent under the new key
	}{
		{"completed keyed write", tools.KeyedWrite, completed, false, jobs.StatusOK, 0, 0},
		{"completed keyed write, old publisher", tools.KeyedWrite, completed, true, jobs.StatusOK, 0, 0},
		{"completed unkeyed write", tools.UnkeyedWrite, completed, false, jobs.StatusOK, 0, 0},
		{"completed unkeyed write, old publisher", tools.UnkeyedWrite, completed, true, jobs.StatusOK, 0, 0},
		{"in-flight keyed write settled while awaited", tools.KeyedWrite, settledWhileAwaited, false, jobs.StatusOK, 0, 0},
		{"expired keyed write taken over", tools.KeyedWrite, expired, true, jobs.StatusOK, 1, 0},
		{"expired unkeyed write", tools.UnkeyedWrite, expired, false, jobs.StatusIndeterminate, 0, 0},
		{"no row: a new call", tools.KeyedWrite, nil, true, jobs.StatusOK, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var sent sentKeys
			exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
				sent.add(r.Key)
				return json.RawMessage(`{"receipt":"after"}`), nil
			})
			reg, err := tools.NewRegistry([]tools.Definition{{Name: "cast_vote", Class: tc.class, Schema: json.RawMessage(`{"type":"object"}`),
				Executor: exec, Timeout: 2 * time.Second, Lease: 5 * time.Second}}, tools.Config{})
			if err != nil {
				t.Fatal(err)
			}
			js, store := startWorker(t, reg, worker.Config{})
			j := &jobs.Job{ConversationID: "conv-upgrade", TurnIndex: 4, Tool: "cast_vote", ToolUseID: "toolu_after", Args: json.RawMessage(votes)}
			call := j.Call()
			_, legacyKey := legacyMaterial(t, call)
			newKey, err := call.Key()
			if err != nil {
				t.Fatal(err)
			}
			if tc.rowBefore != nil {
				tc.rowBefore(t, store, call)
			}
			if tc.oldHeader {
				publishWithKey(t, js, j, legacyKey)
			} else if _, err := jobs.NewClient(js).Publish(context.Background(), j); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			r, err := jobs.NewClient(js).Await(ctx, j.ConversationID, j.ToolUseID)
			if err != nil {
				t.Fatal(err)
			}
			var legacySent, newSent int
			for _, k := range sent.get() {
				switch k {
				case legacyKey:
					legacySent++
				case newKey:
					newSent++
				default:
					t.Errorf("a call sent under key %s, neither %s (legacy) nor %s", k, legacyKey, newKey)
				}
			}
			if r.Status != tc.wantStatus || legacySent != tc.wantLegacy || newSent != tc.wantNew {
				t.Fatalf("result %s (%+v); sent under the legacy key %d time(s), under the new key %d; want %s, %d, %d",
					r.Status, r.Error, legacySent, newSent, tc.wantStatus, tc.wantLegacy, tc.wantNew)
			}
			wantKey := legacyKey
			if tc.rowBefore == nil {
				wantKey = newKey
			}
			if r.Key != wantKey {
				t.Errorf("the result names key %s, want %s: the key of the ledger row that answers it", r.Key, wantKey)
			}
			if tc.wantLegacy+tc.wantNew == 0 && tc.wantStatus == jobs.StatusOK && string(r.Output) != `{"receipt":"before"}` {
				t.Errorf("answered with %s, want the output recorded before the upgrade", r.Output)
			}
			if _, err := store.Get(ctx, newKey); tc.rowBefore != nil && err == nil {
				t.Errorf("a row under the new key %s as well as the legacy one", newKey)
			}
		})
	}
}

// TestJobFromBeforeTheMemberOrderFixKeepsItsKeyWithoutALedger: a keyed
// write whose tool keeps no ledger (its downstream dedupes on the key)
// sends a job published before the fix under the key it was published
// with, the one its earlier deliveries were sent under; a job published
// after the fix goes under the new key.
func TestJobFromBeforeTheMemberOrderFixKeepsItsKeyWithoutALedger(t *testing.T) {
	t.Parallel()
	var sent sentKeys
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		sent.add(r.Key)
		return json.RawMessage(`{}`), nil
	})
	off := false
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "cast_vote", Class: tools.KeyedWrite, Ledger: &off, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 2 * time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{})
	client := jobs.NewClient(js)
	before := &jobs.Job{ConversationID: "conv-upgrade", TurnIndex: 4, Tool: "cast_vote", ToolUseID: "toolu_before", Args: json.RawMessage(votes)}
	_, legacyKey := legacyMaterial(t, before.Call())
	newKey, err := before.Key()
	if err != nil {
		t.Fatal(err)
	}
	publishWithKey(t, js, before, legacyKey)
	after := *before
	after.ToolUseID = "toolu_after"
	if _, err := client.Publish(context.Background(), &after); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, id := range []string{"toolu_before", "toolu_after"} {
		if r, err := client.Await(ctx, before.ConversationID, id); err != nil || r.Status != jobs.StatusOK {
			t.Fatalf("%s: %+v, %v", id, r, err)
		}
	}
	got := sent.get()
	if len(got) != 2 || !(got[0] == legacyKey && got[1] == newKey || got[0] == newKey && got[1] == legacyKey) {
		t.Fatalf("sent under %v, want the legacy key %s once and the new key %s once", got, legacyKey, newKey)
	}
}
