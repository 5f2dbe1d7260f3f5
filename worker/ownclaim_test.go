package worker_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestARestartedProcessWithTheSameOwnerDoesNotRerunADeadAttempt: a process restarted with the same owner (host:1 in every container restart) never takes a dead process's in-flight row for its own lost claim: the unkeyed write takes effect once and is answered indeterminate once the lease ends.
//
// Before the fix: ownClaim takes any in-flight row with this Owner and this
// tool_use_id for the delivery's own lost claim when tracing is off (the
// default: OpenTelemetry's no-op provider gives no valid span, so the span
// check is skipped) and Worker.held of THIS process is empty. A worker that
// died mid-call and came back with the same Owner string (the default
// host:pid is host:1 in every container restart of a pod; a configured
// --owner is the same by construction) meets the redelivery; its claim
// errors transiently (the answer lost, or the statement never ran), the
// retry reads the dead process's row, and the unkeyed write RUNS AGAIN,
// under the dead attempt's fence, without a takeover. Expected: the effect
// once; the job answered indeterminate (holder_lost) once the lease ends.
func TestARestartedProcessWithTheSameOwnerDoesNotRerunADeadAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var effects atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		effects.Add(1) // an unkeyed write: each call is one more ticket
		return json.RawMessage(`{"ticket":1}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "ticket", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 300 * time.Millisecond, Lease: 2 * time.Second}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := sharedEnv(t)
	consumer := worker.Consumer{AckWait: 500 * time.Millisecond}

	// The first process runs the call and dies before recording it.
	died := make(chan struct{})
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	stop1 := runWorker(t, js, store, reg, worker.Config{Owner: "pod-0", Consumer: consumer, ShutdownTimeout: 50 * time.Millisecond,
		Test: worker.TestConfig{Hook: func(p worker.FaultPoint, j *jobs.Job) {
			if p == worker.DuringTool {
				close(died)
				<-hang // never records the outcome: the process is gone
			}
		}}})
	client := jobs.NewClient(js)
	if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "ticket", ToolUseID: "toolu_1", Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-died:
	case <-time.After(10 * time.Second):
		t.Fatal("the first process never ran the call")
	}
	stop1()

	// The same pod restarts; its first claim meets a ledger blip.
	var lost atomic.Bool
	stop2 := runWorker(t, js, store, reg, worker.Config{Owner: "pod-0", Consumer: consumer,
		Test: worker.TestConfig{LoseClaimAnswer: func() bool { return lost.CompareAndSwap(false, true) }}})
	defer stop2()
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	r, err := client.Await(actx, "c", "toolu_1")
	if err != nil || effects.Load() != 1 || r.Status != jobs.StatusIndeterminate {
		t.Fatalf("an unkeyed write whose holder died: %d effect(s), result %+v, await error %v (claim answer lost: %v)", effects.Load(), r, err, lost.Load())
	}
}
