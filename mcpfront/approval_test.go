package mcpfront_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/mcpfront"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// approval is the io.toolq/approval of a result.
func approval(res *mcp.CallToolResult) map[string]any {
	a, _ := res.Meta[mcpfront.MetaApproval].(map[string]any)
	return a
}

// TestACallAwaitingApprovalIsAnsweredAtOnceAndItsReissueGetsTheDecision:
// a call whose tool needs a person's approval is answered at once, not as
// an error, saying it awaits a person and has not run, with its key and
// approval in _meta; sent again before the decision it gets the same
// answer, and after it the final result: the approved call's output (run
// once), the denied call's denial as an error naming who and why.
func TestACallAwaitingApprovalIsAnsweredAtOnceAndItsReissueGetsTheDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, n := approvalNoteStack(t, worker.Config{}, &tools.Approval{Group: "ops"})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	_, addr := serve(t, st, quiet, func(c *mcpfront.Config) { c.Wait = 40 * time.Second })
	svc, err := approvals.New(approvals.Config{Ledger: st.Store, JS: st.JS, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		text    string
		approve bool
	}{{"approve me", true}, {"deny me", false}} {
		args := map[string]any{"text": c.text}
		began := time.Now()
		first := mustCall(t, connect(t, addr), "store_note", args, named("conv-approval", 1))
		a := approval(first)
		if took := time.Since(began); took > 20*time.Second {
			t.Fatalf("the pending answer took %s: the front door waited for the decision", took)
		}
		if first.IsError || status(first) != "awaiting_approval" || key(first) == "" || a == nil || a["args_digest"] == "" || a["group"] != "ops" ||
			!strings.HasPrefix(text(t, first), "awaiting approval by a person (key "+key(first)+", expires ") ||
			!strings.HasSuffix(text(t, first), "; the call has not run") {
			t.Fatalf("%s: the first answer: %s", c.text, asJSON(t, first))
		}
		expires, err := time.Parse(time.RFC3339Nano, a["expires_at"].(string))
		if err != nil || time.Until(expires) < 23*time.Hour {
			t.Fatalf("%s: expires_at %v (%v), want the default ttl of 24h from now", c.text, a["expires_at"], err)
		}
		again := mustCall(t, connect(t, addr), "store_note", args, named("conv-approval", 1))
		if status(again) != "awaiting_approval" || key(again) != key(first) || text(t, again) != text(t, first) {
			t.Fatalf("%s: re-issued before the decision: %s", c.text, asJSON(t, again))
		}
		if _, err := svc.Decide(ctx, key(first), ledger.Decision{Approve: c.approve, By: "alice", Reason: "checked", Group: "ops"}); err != nil {
			t.Fatal(err)
		}
		var final *mcp.CallToolResult
		testenv.Eventually(t, 20*time.Second, c.text+": the re-issue answered with the final result", func() bool {
			final = mustCall(t, connect(t, addr), "store_note", args, named("conv-approval", 1))
			return status(final) != "awaiting_approval"
		})
		switch {
		case key(final) != key(first) || approval(final) == nil || approval(final)["decided_by"] != "alice":
			t.Fatalf("%s: the final answer: %s", c.text, asJSON(t, final))
		case c.approve && (final.IsError || status(final) != "ok" || text(t, final) != `{"stored":true}` || approval(final)["decision"] != "approved"):
			t.Fatalf("%s: the final answer: %s", c.text, asJSON(t, final))
		case !c.approve && (!final.IsError || status(final) != "denied" || !strings.Contains(text(t, final), `"message":"denied by alice: checked; the call did not run"`)):
			t.Fatalf("%s: the final answer: %s", c.text, asJSON(t, final))
		}
	}
	if n.count("approve me") != 1 || n.count("deny me") != 0 {
		t.Fatalf("runs: approved %d (want 1), denied %d (want 0)", n.count("approve me"), n.count("deny me"))
	}
}
