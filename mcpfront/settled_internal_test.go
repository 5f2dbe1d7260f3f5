package mcpfront

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestAnIndeterminateCallThatNowAwaitsApprovalIsAnsweredPending: the
// ledger re-check of an indeterminate result finds the call waiting for a
// person (resolved as not run, its next delivery asked for approval under
// a policy added since): it is answered awaiting approval with what was
// asked, not taken for a call in flight, nor left indeterminate.
func TestAnIndeterminateCallThatNowAwaitsApprovalIsAnsweredPending(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	exec := tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "store_note", Class: tools.KeyedWrite, Executor: exec,
		Schema: json.RawMessage(`{"type":"object"}`), Approval: &tools.Approval{}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := embedded.Start(ctx, embedded.Config{Tools: reg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, err := st.StartWorker(ctx, worker.Config{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	lookup, err := worker.ServeLookup(st.Conn, st.Store, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lookup.Stop() })
	s, err := New(Config{Registry: reg, JS: st.JS, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	j := &jobs.Job{ConversationID: "conv-settled", TurnIndex: 1, Tool: "store_note", ToolUseID: "mcp_x", Args: json.RawMessage(`{"text":"x"}`)}
	pending, err := s.client.PublishAndAwait(ctx, j)
	if err != nil || pending.Status != jobs.StatusAwaitingApproval {
		t.Fatalf("%+v %v", pending, err)
	}
	stale := *pending
	stale.Status, stale.Approval, stale.Error = jobs.StatusIndeterminate, nil, &jobs.ResultError{Code: "reset", Message: "connection reset"}
	got, err := s.settled(ctx, &stale)
	if err != nil || got.Status != jobs.StatusAwaitingApproval || got.Error != nil || got.Approval == nil ||
		got.Approval.ArgsDigest != pending.Approval.ArgsDigest || !got.Approval.ExpiresAt.Equal(pending.Approval.ExpiresAt) {
		t.Fatalf("settled: %+v %v, want awaiting_approval with %+v", got, err, pending.Approval)
	}
	if res := resultOf(got); res.IsError || res.Meta[MetaStatus] != "awaiting_approval" || res.Meta[MetaApproval] == nil {
		t.Fatalf("answered %+v", res)
	}
}
