package integration

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestResultOfAReplayAfterResolveNotRunReachesTheAgent: an unkeyed write
// left indeterminate (the downstream answered 500 and created nothing) is
// resolved as not run, and the job is replayed within the duplicate
// window: the call runs, and its result reaches the results stream and an
// agent waiting for it, after the indeterminate one. The two answers share
// the job's key and tool_use_id; the results stream must not take the
// second for a re-publication of the first.
func TestResultOfAReplayAfterResolveNotRunReachesTheAgent(t *testing.T) {
	t.Parallel()
	o := options{faults: sandbox.Faults{ServerErrorRate: 1}}
	e := setup(t, o)
	e.startWorker(o, nil)
	ctx := context.Background()
	j := job(conv(t), 0, "create_ticket", `{"title":"t","body":"b"}`)
	p := e.publish(j)
	if r := e.await(j); r.Status != jobs.StatusIndeterminate {
		t.Fatalf("first answer %+v", r)
	}
	e.settled()
	if err := e.sandbox.SetFaults(sandbox.Faults{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Resolve(ctx, p.Key, ledger.Resolution{NotRun: true, By: "test", Reason: "no ticket in the tracker"}); err != nil {
		t.Fatal(err)
	}

	e.replayExpectingAnotherAnswer(j, p)
	if n := len(e.sandbox.Tickets()); n != 1 {
		t.Fatalf("%d tickets", n)
	}
	if row := e.row(p.Key); row.State != ledger.Completed || row.Attempt != 2 {
		t.Fatalf("row %s at attempt %d", row.State, row.Attempt)
	}
}

// TestResultOfAJobRunAfterItWasRejectedReachesTheAgent: during a rolling
// deploy a worker that does not know the tool yet rejects the job
// (unknown_tool: nothing ran); replayed to a worker that knows it, within
// the duplicate window, the call runs, and its result reaches the results
// stream and an agent waiting for it, after the rejection.
func TestResultOfAJobRunAfterItWasRejectedReachesTheAgent(t *testing.T) {
	t.Parallel()
	o := options{}
	e := setup(t, o)
	old, err := tools.NewRegistry([]tools.Definition{{Name: "other", Class: tools.Read, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })}},
		tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	w, err := e.stack.NewWorker(wctx, worker.Config{Consumer: o.consumer(), Tools: old, Owner: "old-release",
		Logger: slog.New(slog.NewTextHandler(e.logs, nil))})
	if err != nil {
		stop()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	j := job(conv(t), 0, "create_ticket", `{"title":"t","body":"b"}`)
	p := e.publish(j)
	r := e.await(j)
	e.settled()
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r.Status != jobs.StatusRejected || r.Error == nil || r.Error.Code != "unknown_tool" {
		t.Fatalf("first answer %+v", r)
	}

	e.startWorker(o, nil)
	e.replayExpectingAnotherAnswer(j, p)
	if n := len(e.sandbox.Tickets()); n != 1 {
		t.Fatalf("%d tickets", n)
	}
}

// replayExpectingAnotherAnswer replays the job j, published as p, and
// checks that its second answer, ok, reaches an agent that awaits it and
// the results stream, after the first.
func (e *env) replayExpectingAnotherAnswer(j *jobs.Job, p jobs.Published) {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := e.results(j.ConversationID)
	if len(first) != 1 {
		t.Fatalf("%d results before the replay", len(first))
	}
	reader, err := e.client.Results(ctx, jobs.ResultSubject(j.ConversationID))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	awaiting := reader.Expect(j.ToolUseID)
	reps, err := operate.Replay(ctx, e.js, operate.ReplayRange{Subject: jobs.JobSubject(j.Tool), FromSeq: p.Sequence, ToSeq: p.Sequence}, false)
	if err != nil || len(reps) != 1 {
		t.Fatalf("replay: %+v %v", reps, err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	got, err := awaiting.Wait(wctx)
	if err != nil {
		t.Fatalf("the agent awaiting the replay's answer got none: %v (results in the stream: %d)\n%s", err,
			len(e.results(j.ConversationID)), e.logs.String())
	}
	if got[0].Status != jobs.StatusOK || got[0].ToolUseID != j.ToolUseID {
		t.Fatalf("the replay's answer %+v", got[0])
	}
	e.settled()
	var all []*jobs.Result
	testenv.Eventually(t, 10*time.Second, "two results in the stream", func() bool {
		all = e.results(j.ConversationID)
		return len(all) >= 2
	})
	if len(all) != 2 || all[0].Status != first[0].Status || all[1].Status != jobs.StatusOK || all[1].ToolUseID != j.ToolUseID {
		t.Fatalf("results %+v", all)
	}
}

// TestOutputWithNULIsTheResult: a downstream whose JSON output escapes
// U+0000 (\u0000, which Postgres's jsonb refuses) completes its call on
// the Postgres ledger, and the agent and a duplicate get the output byte
// for byte.
func TestOutputWithNULIsTheResult(t *testing.T) {
	t.Parallel()
	const output = `{"a":"\u0000","b":"x\u0000y"}`
	o := options{}
	e := setup(t, o)
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "nul_write", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return json.RawMessage(output), nil })}},
		tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	w, err := e.stack.NewWorker(wctx, worker.Config{Consumer: o.consumer(), Tools: reg, Logger: slog.New(slog.NewTextHandler(e.logs, nil))})
	if err != nil {
		stop()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	j := job(conv(t), 0, "nul_write", `{}`)
	retried := *j
	retried.ToolUseID += "_retried"
	p := e.publish(j)
	for _, j := range []*jobs.Job{j, &retried} {
		if j == &retried {
			e.publish(j)
		}
		if r := e.await(j); r.Status != jobs.StatusOK || string(r.Output) != output {
			t.Fatalf("%s: %s %s", j.ToolUseID, r.Status, r.Output)
		}
	}
	if row := e.row(p.Key); row.State != ledger.Completed || string(row.Result) != output {
		t.Fatalf("row %s %s", row.State, row.Result)
	}
}
