package approvals_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os/exec"
	"testing"
	"time"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/inbox"
	"github.com/toolq/toolq/ledger"
)

// TestThePageWarnsOfArgsThatReadAsOtherArgs: a model writes args that, as
// Chromium would draw them raw, read as other args: a second key
// "amount<U+200B>_cents" reads as a duplicate "amount_cents" whose last
// value (100) wins, though the tool reads amount_cents = 100000, and
// "a<U+FE0F>cct_9" reads as "acct_9"; or a key with a Cyrillic а beside
// amount_cents, and "раypal.com" with a Cyrillic р and а. The page draws
// neither the canonical JSON nor the value as what they read as (the
// characters that do not show are escaped, and the raw bytes are behind a
// toggle), warns of each, and marks the values; display.mjs compares
// screenshots.
func TestThePageWarnsOfArgsThatReadAsOtherArgs(t *testing.T) {
	t.Parallel()
	chromium := browser(t)
	script := nodeScript(t, "display.mjs")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	store, err := ledger.Open(ctx, "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	appr, err := approvals.New(approvals.Config{Ledger: store, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(inbox.Config{Approvals: appr, Ledger: store, Logger: quiet,
		Approvers: []inbox.Approver{{Name: "alice", Groups: []string{"finance"}, TokenSHA256: sha256.Sum256([]byte(aliceToken))}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(in.Handler())
	t.Cleanup(func() { in.Close(); srv.Close() })

	awaiting := func(args string) string {
		t.Helper()
		sum := sha256.Sum256([]byte(args))
		key := make([]byte, 16)
		rand.Read(key)
		res, err := store.Claim(ctx, []ledger.Claim{{Key: hex.EncodeToString(key), ConversationID: "conv-display", TurnIndex: 1,
			Tool: "send_payment", ArgsDigest: hex.EncodeToString(sum[:]), ToolUseID: "toolu_display", Owner: "test", Lease: time.Minute, Token: "t"}})
		if err != nil || res[0].Err != nil || !res[0].Claimed {
			t.Fatalf("claim: %v %+v", err, res)
		}
		if _, err := store.AwaitApproval(ctx, res[0].Row.Fence(), ledger.ApprovalInfo{Args: json.RawMessage(args), Group: "finance", TTL: time.Hour},
			"toolu_display"); err != nil {
			t.Fatal(err)
		}
		return hex.EncodeToString(key)
	}
	// What the tool reads: 100000 cents to "a\ufe0fcct_9".
	unseen := "{\"amount_cents\":100000,\"amount\u200b_cents\":100,\"to\":\"a\ufe0fcct_9\"}"
	// What the tool reads: 100000 cents to a domain that is not paypal.com.
	lookalike := "{\"amount_cents\":100000,\"to\":\"\u0440\u0430ypal.com\",\"\u0430mount_cents\":100}"
	calls := []map[string]any{
		{"key": awaiting(unseen), "looksLike": `{"amount_cents":100000,"amount_cents":100,"to":"acct_9"}`, "toLooksLike": `"acct_9"`,
			"raw": unseen, "warnings": []string{".hidden-chars", ".lookalikes"}, "flagged": []string{`["amount\u200b_cents"]`, "to"}},
		{"key": awaiting(lookalike), "warnings": []string{".lookalikes"}, "flagged": []string{"to", `["аmount_cents"]`}},
	}
	cfg, _ := json.Marshal(map[string]any{"chromium": chromium, "url": srv.URL + "/", "token": aliceToken, "calls": calls})
	out, err := exec.CommandContext(ctx, "node", script, string(cfg)).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("node: %v", err)
	}
}
