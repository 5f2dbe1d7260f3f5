package operate_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
)

// TestReplayFindsARowUnderTheKeyBeforeTheMemberOrderFix: a job whose args
// had another key before member names were ordered by all their UTF-16
// code units (👎 and 👍 share a high surrogate), and whose call completed
// before the upgrade under that key, is reported as answered from the
// ledger, under that key, as the worker answers it; not as running now.
func TestReplayFindsARowUnderTheKeyBeforeTheMemberOrderFix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := withStreams(t)
	st, err := ledger.OpenSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	j := &jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "cast_vote", ToolUseID: "toolu_1", Args: json.RawMessage(`{"votes":{"👎":3,"👍":12}}`)}
	if _, err := jobs.NewClient(js).Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	m, err := j.Call().Material()
	if err != nil {
		t.Fatal(err)
	}
	legacy, ok := m.Legacy()
	if !ok {
		t.Fatal("no legacy key")
	}
	res, err := st.Claim(ctx, []ledger.Claim{{Key: legacy.Key(), ConversationID: "c", TurnIndex: 1, Tool: "cast_vote",
		ArgsDigest: legacy.ArgsDigest(), ToolUseID: "toolu_0", Owner: "before-the-fix", Lease: time.Hour}})
	if err != nil || !res[0].Claimed {
		t.Fatalf("claim: %v %+v", err, res)
	}
	if err := st.Complete(ctx, res[0].Row.Fence(), json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	dry, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: 1}, true, operate.WithLedger(st))
	if err != nil {
		t.Fatal(err)
	}
	if len(dry) != 1 || dry[0].Outcome != operate.Answered || dry[0].Key != legacy.Key() {
		t.Fatalf("replay %+v, want answered under the legacy key %s", dry, legacy.Key())
	}
}
