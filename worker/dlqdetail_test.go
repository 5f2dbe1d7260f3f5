package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestJobWithAHugeErrorDetailIsDeadLetteredAtTheLimit: a job whose executor fails with an error message larger than the max payload is dead-lettered after MaxDeliver tries, its detail cut to fit.
//
// Before the fix: publishDeadLetter
// checks only that the BODY fits (and omits it otherwise), never that the
// headers do. The Toolq-Dlq-Detail header carries the whole error text, and
// an executor's error message is unbounded (encodeResult cuts it to 1 KiB
// for results; nothing cuts it for the DLQ). An error message over the
// max payload (1 MiB) makes payloadLimit negative, the body is omitted, and
// the headers alone are refused (nats: maximum payload exceeded); settle
// then hands the job back UNCOUNTED, for ever. For a ledger tool whose
// downstream refuses it (NotSent) every redelivery claims the released row
// again and calls the downstream again — the claimed path has no crash
// guard — so the job neither gets a result nor a dead letter and keeps
// hitting its downstream. Expected: a dead letter after MaxDeliver (2) tries.
func TestJobWithAHugeErrorDetailIsDeadLetteredAtTheLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	huge := strings.Repeat("x", 1200<<10) // a downstream's error page, quoted whole
	var calls atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		calls.Add(1)
		return nil, tools.NotSentError("refused", huge, 10*time.Millisecond, nil)
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec,
		Timeout: time.Second, Breaker: tools.Breaker{Failures: 1000}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, Consumer: worker.Consumer{MaxDeliver: 2}})
	if _, err := jobs.NewClient(js).Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "pay", ToolUseID: "toolu_1", Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if n := dlqCount(t, js); n != 1 || calls.Load() > 2 {
		t.Fatalf("a call refused by its downstream with a long message, MaxDeliver 2: %d dead letter(s) after %d calls of the downstream in 5s", n, calls.Load())
	}
}
