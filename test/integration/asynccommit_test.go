package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// noKeyRegistryYAML: a keyed_write that does not forward its key
// (idempotency_header: "-"), which the registry accepts and the tools audit
// flags as able to take effect twice on an ambiguous failure.
const noKeyRegistryYAML = `tools:
  - name: send_payment_nokey
    class: keyed_write
    timeout: 1500ms
    lease: 2s
    breaker: {failures: 1000}
    schema: {type: object}
    http: {method: POST, url: "${TOOLQ_SANDBOX_URL}/v1/payments", idempotency_header: "-"}
`

// TestCrashAfterTheClaimOfAKeyedWriteThatSendsNoKey: the claim of a keyed
// write commits without waiting for the disk only when its key goes
// downstream, where a repeat after a lost claim is collapsed. A keyed write
// that sends no key has nothing to collapse it: Postgres crashes right after
// its claim (before the tool runs, with the WAL writer held back so that an
// asynchronous claim would be lost), the call then succeeds, and it must
// have taken effect once.
func TestCrashAfterTheClaimOfAKeyedWriteThatSendsNoKey(t *testing.T) {
	t.Parallel()
	o := options{ownCluster: true, ackWait: 15 * time.Second, pgSettings: []string{"synchronous_commit=on", "wal_writer_delay=10s"}}
	e := setup(t, o)
	reg, err := tools.Parse([]byte(noKeyRegistryYAML), "no-key registry", tools.Config{
		Logger: slog.New(slog.NewTextHandler(e.logs, nil)),
		Getenv: func(k string) string { return map[string]string{"TOOLQ_SANDBOX_URL": e.sbURL}[k] },
	})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("send_payment_nokey")
	if a := tool.Audit(); !a.CanDoubleFire {
		t.Fatalf("audit: %+v", a)
	} else {
		t.Logf("tools audit says: %s", a.Why)
	}
	j := job(conv(t), 0, "send_payment_nokey", payment("nokey_crash"))
	key, _ := j.Key()
	var crashes atomic.Int32
	crashErr := make(chan error, 1)
	hook := func(p worker.FaultPoint, got *jobs.Job) {
		if p != worker.AfterClaim || got.ToolUseID != j.ToolUseID || crashes.Add(1) != 1 {
			return
		}
		crashErr <- func() error {
			if err := e.cluster.Crash(); err != nil {
				return err
			}
			if err := e.cluster.Start(); err != nil {
				return err
			}
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if _, err := e.store.Get(context.Background(), key); !errors.Is(err, ledger.ErrUnavailable) {
					return nil
				}
			}
			return errors.New("the ledger did not come back")
		}()
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := e.stack.NewWorker(ctx, worker.Config{
		Consumer: o.consumer(), Tools: reg,
		Owner: "nokey", BatchSize: 16, RetryDelay: 100 * time.Millisecond, ShutdownTimeout: 10 * time.Second,
		Logger: slog.New(slog.NewTextHandler(e.logs, nil)), Test: worker.TestConfig{Hook: hook},
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	e.publish(j)
	if err := <-crashErr; err != nil {
		t.Fatal(err)
	}
	r := e.await(j)
	pays := e.sandbox.Payments()
	t.Logf("result %s attempts %d; %d payment(s)", r.Status, r.Attempts, len(pays))
	if len(pays) != 1 {
		var ids []string
		for _, p := range pays {
			ids = append(ids, fmt.Sprintf("%s(key %q)", p.ID, p.IdempotencyKey))
		}
		t.Fatalf("one successful call, %d payments %v: the asynchronous claim was lost in the crash and the call, whose key is not forwarded, ran again", len(pays), ids)
	}
}
