package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestADuplicateGetsTheOriginalsOutput: a duplicate gets the same output as the original, also for an output just under the result limit.
//
// Before the fix: shrinking a
// result changes what a duplicate is told. The limit applies to the whole
// encoded result, and a duplicate's result is longer than the original's
// ("duplicate":true,"original_tool_use_id":…). For an output just under the
// limit, the original tool_use_id receives the tool's real output, while the
// retried turn's tool_use_id, which the design says gets "the stored
// result", receives status ok with {"response_too_large":true,…} in its
// place: two answers to one call, and the second looks like a successful
// tool output. (The agent cannot tell the marker from a real output either:
// the status stays "ok" and nothing else in the result says it was cut.)
func TestADuplicateGetsTheOriginalsOutput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	size := make(chan int, 1)
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		n := <-size
		return json.RawMessage(`{"blob":"` + strings.Repeat("x", n) + `"}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "fetch", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{Propagator: propagation.NewCompositeTextMapPropagator()})
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	for i, slack := range []int{12, 20, 28} {
		j := &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: "fetch", ToolUseID: "toolu_orig", Args: json.RawMessage(`{}`)}
		key, _ := j.Key()
		// The limit the worker computes (payloadLimit) for this result.
		m := nats.NewMsg(jobs.ResultSubject("c"))
		m.Header.Set(jobs.HeaderKey, key)
		m.Header.Set(jetstream.MsgIDHeader, jobs.ResultMsgID(key, j.ToolUseID, "ok:1"))
		limit := int(js.Conn().MaxPayload()) - (m.Size() - len(m.Subject)) - 512
		// The original's encoded size without the blob.
		probe := jobs.NewResult(j, key, jobs.StatusOK)
		probe.Attempts, probe.Output = 1, json.RawMessage(`{"blob":""}`)
		enc, _ := json.Marshal(probe)
		n := limit - slack - len(enc)
		size <- n

		orig, err := client.PublishAndAwait(actx, j)
		if err != nil {
			t.Fatal(err)
		}
		dupJob := *j
		dupJob.ToolUseID = "toolu_dupl"
		dup, err := client.PublishAndAwait(actx, &dupJob)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("output %d bytes, limit %d: original %d bytes of output, duplicate=%v %d bytes of output %.60s", n+11, limit, len(orig.Output), dup.Duplicate, len(dup.Output), dup.Output)
		if string(orig.Output) != string(dup.Output) {
			t.Errorf("one call, two answers: toolu_orig got the %d-byte output, the duplicate toolu_dupl (status %s) got %s",
				len(orig.Output), dup.Status, dup.Output)
		}
	}
}
