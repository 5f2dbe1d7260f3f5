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

// TestWhetherAnOutputFitsDependsOnTheOutputAlone: whether an output fits a result depends on the output alone, not on the length of the tool_use_id it is addressed to: the original and a duplicate get the same output.
//
// Before the fix: after a5173a3 whether an
// output "fits" is still not decided from the output alone. encodeResult
// compares len(output) with limit − 4 KiB, and limit (payloadLimit) is the
// max payload less THIS message's headers, which hold
// Nats-Msg-Id result:<key>:<tool_use_id>; tool_use_id may be 1 to 128
// characters. An output within ~127 bytes under the cut reaches a job with a
// short tool_use_id whole, and a duplicate with a long one as
// {"response_too_large":true,…} with status ok: one call, two answers.
// Expected: the original and the duplicate get the same output.
func TestWhetherAnOutputFitsDependsOnTheOutputAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	size := make(chan int, 1)
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"blob":"` + strings.Repeat("x", <-size) + `"}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "fetch", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{Propagator: propagation.NewCompositeTextMapPropagator()})
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	j := &jobs.Job{ConversationID: "c", Tool: "fetch", ToolUseID: "t", Args: json.RawMessage(`{}`)}
	key, _ := j.Key()
	m := nats.NewMsg(jobs.ResultSubject("c"))
	m.Header.Set(jobs.HeaderKey, key)
	m.Header.Set(jetstream.MsgIDHeader, jobs.ResultMsgID(key, j.ToolUseID, "ok:1"))
	limit := int(js.Conn().MaxPayload()) - (m.Size() - len(m.Subject)) - 512 // payloadLimit for the original
	outLen := limit - 4<<10 - 60                                             // fits the original's limit by 60 bytes
	size <- outLen - len(`{"blob":""}`)
	orig, err := client.PublishAndAwait(actx, j)
	if err != nil {
		t.Fatal(err)
	}
	dupJob := *j
	dupJob.ToolUseID = strings.Repeat("u", 128) // the retried turn, a longer (valid) tool_use_id
	dup, err := client.PublishAndAwait(actx, &dupJob)
	if err != nil {
		t.Fatal(err)
	}
	if string(orig.Output) != string(dup.Output) {
		t.Fatalf("one call, two answers: tool_use_id %q got %d bytes of output, its duplicate (128-char tool_use_id, status %s, duplicate=%v) got %s",
			j.ToolUseID, len(orig.Output), dup.Status, dup.Duplicate, dup.Output)
	}
}
