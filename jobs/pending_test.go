package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// approvalStack is a stack whose registry is one keyed write, pay, that
// needs a person's approval for every call (group finance, ttl as given),
// with a worker that sweeps approvals every 100 ms.
type approvalStack struct {
	st        *embedded.Stack
	client    *jobs.Client
	approvals *approvals.Service
	runs      atomic.Int32
}

func startApprovalStack(ctx context.Context, t *testing.T, ttl time.Duration) *approvalStack {
	t.Helper()
	s := &approvalStack{}
	pay := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		s.runs.Add(1)
		return json.RawMessage(`{"paid":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Executor: pay,
		Schema:   json.RawMessage(`{"type":"object","properties":{"amount_cents":{"type":"integer"}}}`),
		Approval: &tools.Approval{TTL: ttl, Group: "finance"}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	s.st, err = embedded.Start(ctx, embedded.Config{Tools: reg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.st.Close)
	if _, err := s.st.StartWorker(ctx, worker.Config{Logger: quiet, ApprovalSweep: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if s.approvals, err = approvals.New(approvals.Config{Ledger: s.st.Store, JS: s.st.JS, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	s.client = jobs.NewClient(s.st.JS)
	return s
}

// decide records alice's decision on the call key; t.Error on failure, so
// that a goroutine may decide.
func (s *approvalStack) decide(ctx context.Context, t *testing.T, key string, approve bool) {
	t.Helper()
	if _, err := s.approvals.Decide(ctx, key, ledger.Decision{Approve: approve, By: "alice", Reason: "invoice 42", Group: "finance"}); err != nil {
		t.Error(err)
	}
}

func payCall(id string, cents int) jobs.ToolCall {
	return jobs.ToolCall{ToolUseID: id, Tool: "pay", Args: json.RawMessage(fmt.Sprintf(`{"amount_cents":%d}`, cents))}
}

// TestAPendingApprovalIsAnsweredAtOnceAndUntilFinalWaitsForTheDecision:
// RunTurn returns a call awaiting approval at once, as a tool_result that
// says so and is not an error; Await with UntilFinal waits past it for the
// result that follows the decision, while Await without it returns the
// pending result, and the final one once it came.
func TestAPendingApprovalIsAnsweredAtOnceAndUntilFinalWaitsForTheDecision(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := startApprovalStack(ctx, t, time.Hour)
	trs, err := s.client.RunTurn(ctx, "conv-pending", 1, []jobs.ToolCall{payCall("toolu_p", 1)})
	if err != nil {
		t.Fatal(err)
	}
	tr := trs[0]
	r := tr.Result
	var text string
	if err := json.Unmarshal(tr.Content, &text); err != nil {
		t.Fatalf("the pending tool_result is not a string: %s", tr.Content)
	}
	if tr.IsError || r.Status != jobs.StatusAwaitingApproval || r.Approval == nil ||
		text != "awaiting approval by a person (key "+r.Key+", expires "+r.Approval.ExpiresAt.UTC().Format(time.RFC3339)+"); the call has not run" {
		t.Fatalf("pending tool_result: %+v %q", tr, text)
	}

	final := make(chan *jobs.Result, 1)
	go func() {
		res, err := s.client.Await(ctx, "conv-pending", "toolu_p", jobs.UntilFinal())
		if err != nil {
			t.Error(err)
		}
		final <- res
	}()
	if res, err := s.client.Await(ctx, "conv-pending", "toolu_p"); err != nil || res.Status != jobs.StatusAwaitingApproval {
		t.Fatalf("Await before the decision: %+v %v", res, err)
	}
	select {
	case res := <-final:
		t.Fatalf("Await with UntilFinal returned before the decision: %+v", res)
	case <-time.After(300 * time.Millisecond):
	}
	if s.runs.Load() != 0 {
		t.Fatal("the call ran before it was approved")
	}
	s.decide(ctx, t, r.Key, true)
	res := <-final
	if res == nil || res.Status != jobs.StatusOK || res.Approval == nil || res.Approval.Decision != "approved" || s.runs.Load() != 1 {
		t.Fatalf("final result: %+v (%d runs)", res, s.runs.Load())
	}
	if res, err := s.client.Await(ctx, "conv-pending", "toolu_p"); err != nil || res.Status != jobs.StatusOK {
		t.Fatalf("Await after the decision: %+v %v", res, err)
	}
	all, err := s.client.AwaitAll(ctx, "conv-pending", []string{"toolu_p"}, jobs.UntilFinal())
	if err != nil || all["toolu_p"].Status != jobs.StatusOK {
		t.Fatalf("AwaitAll after the decision: %+v %v", all, err)
	}
}

// TestAReaderThatGaveThePendingResultGivesTheFinalOneToo: a Results
// reader keeps an id awaited past its result awaiting approval: the Wait
// that returned the pending result can be called again, with UntilFinal,
// and gets the final one; a Wait with UntilFinal from the start skips the
// pending one.
func TestAReaderThatGaveThePendingResultGivesTheFinalOneToo(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := startApprovalStack(ctx, t, time.Hour)
	rs, err := s.client.Results(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	first := rs.ExpectIn("conv-reader", "toolu_r1")
	second := rs.ExpectIn("conv-reader", "toolu_r2")
	for _, id := range []string{"toolu_r1", "toolu_r2"} {
		c := payCall(id, 2)
		if _, err := s.client.Publish(ctx, &jobs.Job{ConversationID: "conv-reader", TurnIndex: 1, Tool: c.Tool, ToolUseID: c.ToolUseID, Args: c.Args}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := first.Wait(ctx)
	if err != nil || got[0].Status != jobs.StatusAwaitingApproval {
		t.Fatalf("first wait: %+v %v", got, err)
	}
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	if got, err := second.Wait(short, jobs.UntilFinal()); !errors.Is(err, context.DeadlineExceeded) || got[0] == nil || got[0].Status != jobs.StatusAwaitingApproval {
		t.Fatalf("a wait with UntilFinal before the decision: %+v %v (want its deadline, with the pending result)", got, err)
	}
	s.decide(ctx, t, got[0].Key, true)
	for name, aw := range map[string]*jobs.Awaiting{"the wait that had the pending result": first, "the wait until final": second} {
		got, err := aw.Wait(ctx, jobs.UntilFinal())
		if err != nil || got[0].Status != jobs.StatusOK {
			t.Fatalf("%s: %+v %v", name, got, err)
		}
	}
	if got, err := first.Wait(ctx); err != nil || got[0].Status != jobs.StatusOK {
		t.Fatalf("a wait without UntilFinal after the final result: %+v %v", got, err)
	}
	if n := s.runs.Load(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
}

// TestTheRecordShowsAPendingApprovalAndADenial: a turn committed while its
// call awaits approval records the pending tool_result; the next turn's
// identical call, committed with UntilFinal after a person denied it,
// records the denial as an error naming who denied it and why.
func TestTheRecordShowsAPendingApprovalAndADenial(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := startApprovalStack(ctx, t, time.Hour)
	rs, err := s.client.Results(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	conv := rs.NewConversation("conv-record")
	turn := conv.NextTurn()
	a := turn.Attempt()
	if _, err := a.Dispatch(ctx, payCall("toolu_d0", 3)); err != nil {
		t.Fatal(err)
	}
	ct, err := turn.Commit(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if tr := ct.ToolResults[0]; tr.IsError || !strings.Contains(string(tr.Content), "awaiting approval by a person") {
		t.Fatalf("the pending call's record: %+v", tr)
	}

	next := conv.NextTurn()
	b := next.Attempt()
	if _, err := b.Dispatch(ctx, payCall("toolu_d1", 4)); err != nil {
		t.Fatal(err)
	}
	go func() {
		// The decision comes while the turn waits for it.
		res, err := s.client.Await(ctx, "conv-record", "toolu_d1")
		if err != nil {
			t.Error(err)
			return
		}
		s.decide(ctx, t, res.Key, false)
	}()
	ct, err = next.Commit(ctx, b, jobs.UntilFinal())
	if err != nil {
		t.Fatal(err)
	}
	tr := ct.ToolResults[0]
	want := `{"error":{"code":"approval_denied","message":"denied by alice: invoice 42; the call did not run"},"status":"denied"}`
	if !tr.IsError || tr.Result.Status != jobs.StatusDenied || string(tr.Content) != want {
		t.Fatalf("the denied call's record: %s (is_error %v), want %s", tr.Content, tr.IsError, want)
	}
	if err := conv.Check(); err != nil {
		t.Fatal(err)
	}
	if n := s.runs.Load(); n != 0 {
		t.Fatalf("%d runs, want none", n)
	}
}

// TestAnExpiredApprovalEndsAWaitUntilFinal: a call nobody decides before
// its approval expires is answered expired, which is final: the wait ends
// with an error the model reads, and the call never ran.
func TestAnExpiredApprovalEndsAWaitUntilFinal(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := startApprovalStack(ctx, t, time.Second)
	trs, err := s.client.RunTurn(ctx, "conv-expired", 1, []jobs.ToolCall{payCall("toolu_e", 5)}, jobs.UntilFinal())
	if err != nil {
		t.Fatal(err)
	}
	tr := trs[0]
	if !tr.IsError || tr.Result.Status != jobs.StatusExpired || !strings.Contains(string(tr.Content), `"code":"approval_expired"`) ||
		!strings.Contains(string(tr.Content), "expired: no person decided before ") || !strings.Contains(string(tr.Content), "the call did not run") {
		t.Fatalf("expired tool_result: %s (is_error %v)", tr.Content, tr.IsError)
	}
	if n := s.runs.Load(); n != 0 {
		t.Fatalf("%d runs, want none", n)
	}
}

// TestToolResultOfEachStatus: what the model reads of each result, from
// testdata/tool_results.jsonl, the vectors the TypeScript and Python
// clients check too.
func TestToolResultOfEachStatus(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("testdata/tool_results.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for line := range strings.Lines(string(data)) {
		var v struct {
			Name    string
			Result  json.RawMessage
			Content json.RawMessage
			IsError bool `json:"is_error"`
		}
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatal(err)
		}
		rows++
		r, err := jobs.DecodeResult(v.Result)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		tr := r.ToolResult()
		var got, want any
		if err := json.Unmarshal(tr.Content, &got); err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		_ = json.Unmarshal(v.Content, &want)
		if !reflect.DeepEqual(got, want) || tr.IsError != v.IsError || tr.ToolUseID != r.ToolUseID {
			t.Errorf("%s: %s (is_error %v), want %s (is_error %v)", v.Name, tr.Content, tr.IsError, v.Content, v.IsError)
		}
	}
	if rows < 10 {
		t.Fatalf("%d vectors", rows)
	}
}
