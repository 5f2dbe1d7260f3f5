package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/ledger"
)

// TestLedgerShowSaysARowAnsweredADuplicate: an operator reading a row
// that has answered a duplicate (a retried turn, just after the call
// completed) is not told that no duplicate was answered from it.
func TestLedgerShowSaysARowAnsweredADuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	env := map[string]string{"TOOLQ_DATA_DIR": dir}
	st := migratedLedger(t, env)
	c := ledger.Claim{Key: "k-paid", ConversationID: "c", Tool: "send_payment", ArgsDigest: "d", ToolUseID: "toolu_1", Owner: "o", Lease: time.Hour}
	res, err := st.Claim(ctx, []ledger.Claim{c})
	if err != nil || !res[0].Claimed {
		t.Fatalf("claim: %v %+v", err, res)
	}
	if err := st.Complete(ctx, res[0].Row.Fence(), json.RawMessage(`{"paid":true}`)); err != nil {
		t.Fatal(err)
	}
	dup := c
	dup.ToolUseID = "toolu_retried"
	if res, err := st.Claim(ctx, []ledger.Claim{dup}); err != nil || res[0].Claimed || res[0].Row.State != ledger.Completed {
		t.Fatalf("the duplicate was not answered from the row: %v %+v", err, res)
	}
	out, err := runConsumer(t, env, "ledger", "show", "k-paid")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "no duplicate answered from it") {
		t.Fatalf("ledger show of a row that answered a duplicate says it answered none:\n%s", out)
	}
}

// TestLedgerPurgeDeletesWhatItsHelpSays: 'consumer ledger purge --help'
// says it deletes finished rows neither updated nor answering for more than
// D and the hour a row's record of its answers may lag: of two completed
// rows that answered nothing, --older-than 31d keeps the one last updated
// 31 days and 30 minutes ago and deletes the one of 31 days and 90
// minutes, and its report says before when the rows it deleted finished.
func TestLedgerPurgeDeletesWhatItsHelpSays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, env := purgeEnv(t)
	help, _ := runConsumer(t, env, "ledger", "purge", "--help")
	if !strings.Contains(help, "neither updated nor answering a duplicate") || !strings.Contains(help, "the hour") {
		t.Fatalf("purge --help does not say what a row's age counts from:\n%s", help)
	}
	st, err := ledger.Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	raw, err := sql.Open("sqlite", filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for key, age := range map[string]time.Duration{"within-the-hour": 31*24*time.Hour + 30*time.Minute, "past-the-hour": 31*24*time.Hour + 90*time.Minute} {
		res, err := st.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: "c", Tool: "send_payment", ArgsDigest: "d", ToolUseID: "toolu_1", Owner: "o", Lease: time.Hour}})
		if err != nil || !res[0].Claimed {
			t.Fatalf("claim: %v", err)
		}
		if err := st.Complete(ctx, res[0].Row.Fence(), json.RawMessage(`{}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Exec(`UPDATE toolq_ledger SET updated_at = updated_at - ? WHERE key = ?`, age.Milliseconds(), key); err != nil {
			t.Fatal(err)
		}
	}
	out, err := runConsumer(t, env, "ledger", "purge", "--older-than", "31d")
	if err != nil || !strings.Contains(out, "purged 1 row(s) finished before ") {
		t.Fatalf("purge --older-than 31d: %q %v", out, err)
	}
	before, err := time.Parse(time.RFC3339, strings.TrimSpace(strings.SplitAfter(out, "finished before ")[1]))
	if err != nil || time.Since(before) < 31*24*time.Hour+time.Hour-time.Minute {
		t.Fatalf("the report's time %q is not the cutoff less the hour (%v)", out, err)
	}
	if _, err := st.Get(ctx, "within-the-hour"); err != nil {
		t.Fatalf("the row within the hour past the retention was purged: %v", err)
	}
	if _, err := st.Get(ctx, "past-the-hour"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("the row past the retention and the hour was kept: %v", err)
	}
}
