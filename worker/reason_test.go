package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestDuplicateSpanSaysWhyNothingRan: the span of a delivery that did not
// run its call carries a toolq.duplicate event naming why, for each reason
// besides completed_before (TestEachDuplicateRouteHasItsSeries has that
// one): it waited for the attempt in flight elsewhere, the call is
// indeterminate, or the key holds another call's material (a collision,
// answered rejected and never with the stored output).
func TestDuplicateSpanSaysWhyNothingRan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	started, release := make(chan struct{}, 1), make(chan struct{})
	schema := json.RawMessage(`{"type":"object"}`)
	reg, _ := tools.NewRegistry([]tools.Definition{
		{Name: "slow", Class: tools.KeyedWrite, Schema: schema, Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			started <- struct{}{}
			<-release
			return json.RawMessage(`{"id":"s1"}`), nil
		})},
		{Name: "ticket", Class: tools.UnkeyedWrite, Schema: schema, Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			return nil, tools.AmbiguousError("reset", "connection reset after the request was sent", 0, nil)
		})},
		{Name: "pay", Class: tools.KeyedWrite, Schema: schema, Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			return json.RawMessage(`{"id":"p1"}`), nil
		})},
	}, tools.Config{})
	spans := tracetest.NewSpanRecorder()
	js, store := startWorker(t, reg, worker.Config{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))})
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	job := func(tool, id string) *jobs.Job {
		return &jobs.Job{ConversationID: "c", Tool: tool, ToolUseID: id, Args: json.RawMessage(`{"n":1}`)}
	}
	await := func(j *jobs.Job, want jobs.Status) *jobs.Result {
		t.Helper()
		r, err := client.Await(actx, j.ConversationID, j.ToolUseID)
		if err != nil || r.Status != want {
			t.Fatalf("%s: %+v %v, want %s", j.ToolUseID, r, err, want)
		}
		return r
	}

	// In flight elsewhere: the retried turn arrives while the first attempt runs.
	first, retried := job("slow", "toolu_slow_1"), job("slow", "toolu_slow_2")
	if _, err := client.Publish(actx, first); err != nil {
		t.Fatal(err)
	}
	<-started
	if _, err := client.Publish(actx, retried); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the retried turn is waiting on the row
	close(release)
	await(first, jobs.StatusOK)
	if r := await(retried, jobs.StatusOK); !r.Duplicate {
		t.Fatalf("the retried turn ran: %+v", r)
	}

	// Indeterminate: the unkeyed write's outcome is unknown, and its retried
	// turn gets that answer, never a second run.
	if _, err := client.Publish(actx, job("ticket", "toolu_ticket_1")); err != nil {
		t.Fatal(err)
	}
	await(job("ticket", "toolu_ticket_1"), jobs.StatusIndeterminate)
	if _, err := client.Publish(actx, job("ticket", "toolu_ticket_2")); err != nil {
		t.Fatal(err)
	}
	await(job("ticket", "toolu_ticket_2"), jobs.StatusIndeterminate)

	// Collision: the key's row holds other material.
	clash := job("pay", "toolu_clash")
	m, err := clash.Call().Material()
	if err != nil {
		t.Fatal(err)
	}
	other := ledger.Claim{Key: m.Key(), ConversationID: "c", Tool: "pay", ArgsDigest: "00" + m.ArgsDigest()[2:], ToolUseID: "toolu_other",
		Owner: "elsewhere", Lease: time.Minute, Token: "other"}
	if res, err := store.Claim(ctx, []ledger.Claim{other}); err != nil || !res[0].Claimed {
		t.Fatalf("the other call's claim: %+v %v", res, err)
	}
	if _, err := client.Publish(actx, clash); err != nil {
		t.Fatal(err)
	}
	if r := await(clash, jobs.StatusRejected); r.Error == nil || r.Error.Code != "key_collision" {
		t.Fatalf("collision answered %+v", r)
	}

	want := map[string]string{"toolu_slow_2": "waited_for_in_flight", "toolu_ticket_2": "indeterminate", "toolu_clash": "collision"}
	originals := map[string]string{"toolu_slow_2": "toolu_slow_1", "toolu_ticket_2": "toolu_ticket_1"}
	got := map[string]map[attribute.Key]string{}
	collect := func() bool {
		clear(got)
		for _, s := range spans.Ended() {
			var id string
			for _, kv := range s.Attributes() {
				if kv.Key == "toolq.tool_use_id" {
					id = kv.Value.AsString()
				}
			}
			for _, e := range s.Events() {
				if e.Name != "toolq.duplicate" {
					continue
				}
				attrs := map[attribute.Key]string{}
				for _, kv := range e.Attributes {
					attrs[kv.Key] = kv.Value.String()
				}
				got[id] = attrs
			}
		}
		return len(got) >= len(want)
	}
	// A span ends after its result is published: wait for the last one.
	testenv.Eventually(t, 10*time.Second, "the duplicate events", collect)
	for id, reason := range want {
		attrs, ok := got[id]
		if !ok {
			t.Errorf("%s: no toolq.duplicate event (events: %v)", id, got)
			continue
		}
		if attrs["toolq.duplicate.reason"] != reason {
			t.Errorf("%s: reason %q, want %q", id, attrs["toolq.duplicate.reason"], reason)
		}
		if o := originals[id]; o != "" && attrs["toolq.original.tool_use_id"] != o {
			t.Errorf("%s: original %q, want %q", id, attrs["toolq.original.tool_use_id"], o)
		}
	}
}
