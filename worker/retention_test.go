package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/operate"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestDuplicateAnsweredBehindAnOpenBreakerCountsForRetention: a duplicate
// answered from the ledger while the tool's breaker is open (breakerOpen,
// which reads the row without a claim) records its answer, so a purge keeps
// the row as long as that duplicate's job may come back; had it not, a
// replay of the job after the purge would run the call a second time.
func TestDuplicateAnsweredBehindAnOpenBreakerCountsForRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var payCalls, openerCalls atomic.Int32
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		if strings.Contains(string(r.Args), "opener") {
			if openerCalls.Add(1) == 1 {
				return nil, tools.NotSentError("connection_refused", "down", 10*time.Millisecond, nil)
			}
			return json.RawMessage(`{"ok":true}`), nil
		}
		payCalls.Add(1)
		return json.RawMessage(`{"paid":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Timeout: 5 * time.Second, Breaker: tools.Breaker{Failures: 1, OpenFor: 15 * time.Second, HalfOpen: 1}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond})
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	call := jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "pay", Args: json.RawMessage(`{"amount":5}`)}
	first := call
	first.ToolUseID = "toolu_first"
	if r, err := client.PublishAndAwait(actx, &first); err != nil || r.Status != jobs.StatusOK {
		t.Fatalf("first: %+v %v", r, err)
	}
	key, _ := first.Key()

	const retention = 2 * time.Second
	testenv.Eventually(t, 10*time.Second, "the row to age past the retention", func() bool {
		n, err := store.PurgeCount(ctx, retention)
		return err == nil && n >= 1
	})

	// Open the breaker.
	if _, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", TurnIndex: 2, Tool: "pay", ToolUseID: "toolu_opener", Args: json.RawMessage(`{"who":"opener"}`)}); err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	testenv.Eventually(t, 10*time.Second, "the breaker to open", func() bool { return tool.BreakerWait() > 0 })

	// The retried turn's duplicate is answered from the row, behind the open breaker.
	dup := call
	dup.ToolUseID = "toolu_dup"
	pub, err := client.Publish(actx, &dup)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := client.Await(actx, "c", "toolu_dup"); err != nil || r.Status != jobs.StatusOK {
		t.Fatalf("duplicate: %+v %v", r, err)
	}
	if tool.BreakerWait() == 0 {
		t.Fatal("the breaker closed before the duplicate was answered; the duplicate went through a claim")
	}
	row, err := store.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("row answered_at after a duplicate was answered from it: %v", row.AnsweredAt)

	// The operator's purge with retention R: the duplicate was answered
	// just now, so its job can come back for R from now; the row must stay.
	n, err := store.Purge(ctx, retention, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		return // the row stayed: sound
	}
	// The duplicate's job comes back (a replay of TOOLQ_JOBS, a requeue):
	// with the row gone it runs the call again.
	testenv.Eventually(t, 20*time.Second, "the breaker to close", func() bool { return tool.BreakerWait() == 0 })
	reps, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobSubject("pay"), FromSeq: pub.Sequence, ToSeq: pub.Sequence}, false, operate.WithLedger(store))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the replayed duplicate to run", func() bool { return payCalls.Load() >= 2 })
	t.Fatalf("a purge with retention %v deleted the row (%d) right after a duplicate was answered from it behind an open breaker "+
		"(answered_at %v); the duplicate's job, replayed (%+v), then ran the call again: pay executed %d times",
		retention, n, row.AnsweredAt, reps, payCalls.Load())
}
