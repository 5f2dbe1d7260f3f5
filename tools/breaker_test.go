package tools_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/tools"
)

// breakerTool registers one keyed write run by exec behind a breaker with
// the given settings.
func breakerTool(t *testing.T, b tools.Breaker, exec tools.ExecutorFunc) *tools.Tool {
	t.Helper()
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(anySchema),
		Executor: exec, Timeout: time.Second, Concurrency: 64, Breaker: b}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	return tool
}

func failing(context.Context, tools.Request) (json.RawMessage, error) {
	return nil, tools.AmbiguousError("http_500", "down", 0, nil)
}

// TestBreakerDoesNotDeadlockUnderLoad: trial calls failing in half-open
// while other calls are refused must not lock the breaker: every call of 32
// goroutines against a failing downstream returns.
func TestBreakerDoesNotDeadlockUnderLoad(t *testing.T) {
	t.Parallel()
	tool := breakerTool(t, tools.Breaker{Failures: 1, OpenFor: time.Millisecond}, failing)
	const workers, calls = 32, 200
	var returned atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				tool.Run(context.Background(), tools.Request{Tool: "pay", Key: "k", Args: json.RawMessage(`{}`)})
				returned.Add(1)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("breaker stuck: %d of %d calls returned", returned.Load(), workers*calls)
	}
}

// TestBreakerRetryAfterIsTheRemainingOpenTime: a call refused by an open
// breaker is told to come back when the open period ends; one refused while
// the half-open trial runs, after an open period (the trial may fail and
// reopen it), not after a token pause.
func TestBreakerRetryAfterIsTheRemainingOpenTime(t *testing.T) {
	t.Parallel()
	const openFor = 2 * time.Second
	var trial atomic.Bool
	started := make(chan struct{})
	release := make(chan struct{})
	tool := breakerTool(t, tools.Breaker{Failures: 1, OpenFor: openFor}, func(ctx context.Context, req tools.Request) (json.RawMessage, error) {
		if trial.Load() {
			close(started)
			<-release
			return json.RawMessage(`{}`), nil
		}
		return failing(ctx, req)
	})
	run := func() (tools.Outcome, *tools.Error) {
		_, err := tool.Run(context.Background(), tools.Request{Tool: "pay", Key: "k", Args: json.RawMessage(`{}`)})
		return tools.Classify(err)
	}
	if o, _ := run(); o != tools.Ambiguous {
		t.Fatalf("first call: %s", o)
	}
	opened := time.Now()
	o, te := run()
	if o != tools.NotSent || te.Code != "breaker_open" {
		t.Fatalf("while open: %s %+v", o, te)
	}
	if elapsed := time.Since(opened); te.RetryAfter > openFor || te.RetryAfter < openFor-elapsed-100*time.Millisecond {
		t.Fatalf("while open: retry after %v, want about %v", te.RetryAfter, openFor-elapsed)
	}
	// Half-open: the trial call is in flight, the others are refused.
	deadline := time.Now().Add(10 * time.Second)
	for tool.BreakerState() != "half-open" {
		if time.Now().After(deadline) {
			t.Fatalf("breaker %s after its open period", tool.BreakerState())
		}
		time.Sleep(10 * time.Millisecond)
	}
	trial.Store(true)
	trialDone := make(chan struct{})
	go func() { defer close(trialDone); run() }()
	<-started
	o, te = run()
	close(release)
	<-trialDone
	if o != tools.NotSent || te.Code != "breaker_open" {
		t.Fatalf("while half-open: %s %+v", o, te)
	}
	if te.RetryAfter != openFor {
		t.Fatalf("while half-open with the trial in flight: retry after %v, want the open period %v", te.RetryAfter, openFor)
	}
}
