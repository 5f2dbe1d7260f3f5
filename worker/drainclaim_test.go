package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestClaimWhoseAnswerWasLostAsTheDrainStartsIsGivenBack pins that a claim
// that committed, but whose answer was lost while the drain started, is
// given back before the worker stops: the next consumer runs the call (it
// was never sent) instead of waiting out the lease and answering an unkeyed
// write indeterminate.
func TestClaimWhoseAnswerWasLostAsTheDrainStartsIsGivenBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, store := sharedEnv(t)
	var sent atomic.Int32
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "ticket", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Timeout: time.Second, Lease: 3 * time.Second,
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			sent.Add(1)
			return json.RawMessage(`{"ticket":1}`), nil
		})}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := worker.Config{RetryDelay: 20 * time.Millisecond, Consumer: worker.Consumer{AckWait: time.Second}, Logger: testLogger(t)}
	lossy := cfg
	lossy.Test.LoseClaimAnswer = func() bool { return true }
	stopA := runWorker(t, js, store, reg, lossy)
	client := jobs.NewClient(js)
	p, err := client.Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "ticket", ToolUseID: "toolu_ticket", Args: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the claim committed", func() bool {
		_, err := store.Get(ctx, p.Key)
		return err == nil
	})
	stopA() // the drain starts while the claim's answer is being retried
	if row, err := store.Get(ctx, p.Key); err == nil && row.State == ledger.InFlight {
		t.Errorf("the drained worker left its claim in flight (attempt %d, lease %s left)", row.Attempt, row.LeaseRemaining)
	} else if err != nil && !errors.Is(err, ledger.ErrNotFound) {
		t.Fatal(err)
	}
	stopB := runWorker(t, js, store, reg, cfg)
	defer stopB()
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	res, err := client.Await(actx, "c", "toolu_ticket")
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != jobs.StatusOK || sent.Load() != 1 {
		t.Fatalf("a call never sent was answered %s (%+v) after %d send(s), want ok after 1", res.Status, res.Error, sent.Load())
	}
}
