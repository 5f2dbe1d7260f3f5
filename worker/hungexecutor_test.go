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

// TestHungExecutorIsGivenUpAfterItsTimeout: an executor that ignores its context is kept alive only until its timeout and a grace period; then the job ends (a retry and a result, or a dead letter), never silence.
//
// Before the fix: an executor that does
// not return at its tool's Timeout (it ignores ctx: a blocking syscall, a
// library without a context) is heartbeated for ever. The heartbeat sends
// InProgress (and, with a ledger row, extends the lease) every tick with no
// bound, so JetStream never redelivers the job, no other worker ever
// takes it over, the crash guard is never reached, and the job gets neither
// a result nor a dead letter: silence. For a read tool this is new with the
// heartbeat of unclaimed tools (34260ec): before it, the job was redelivered
// after AckWait and answered elsewhere. Here Timeout is 200ms, the lease
// 500ms, AckWait 300ms; the test waits 25 × the timeout. Expected: the job
// ends (a retry then a result, or a dead letter) once the timeout and the
// lease have passed.
func TestHungExecutorIsGivenUpAfterItsTimeout(t *testing.T) {
	for _, class := range []tools.Class{tools.Read, tools.KeyedWrite} {
		t.Run(string(class), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			hang := make(chan struct{})
			var calls atomic.Int32
			exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
				if calls.Add(1) == 1 {
					<-hang // ignores ctx: hangs past its timeout
				}
				return json.RawMessage(`{"ok":true}`), nil
			})
			reg, err := tools.NewRegistry([]tools.Definition{{Name: "hang", Class: class, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec,
				Timeout: 200 * time.Millisecond, Lease: 500 * time.Millisecond}}, tools.Config{})
			if err != nil {
				t.Fatal(err)
			}
			js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, ShutdownTimeout: 100 * time.Millisecond,
				Consumer: worker.Consumer{AckWait: 300 * time.Millisecond, MaxDeliver: 2}})
			t.Cleanup(func() { close(hang) }) // before the worker stops
			client := jobs.NewClient(js)
			if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "hang", ToolUseID: "toolu_1", Args: json.RawMessage(`{}`)}); err != nil {
				t.Fatal(err)
			}
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			r, err := client.Await(actx, "c", "toolu_1")
			if n := dlqCount(t, js); err != nil && n == 0 {
				t.Fatalf("%s executor hung past its 200ms timeout: after 5s no result (%v) and no dead letter; %d call(s)", class, err, calls.Load())
			} else {
				t.Logf("result %+v, %d dead letter(s)", r, n)
			}
		})
	}
}
