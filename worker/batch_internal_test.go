package worker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBatcherGroupsWhileOneBatchIsInFlight: requests that arrive while a
// batch is being written go together in the next one, never more than
// maxBatch at a time and never two batches at once, and every request gets
// its own answer.
func TestBatcherGroupsWhileOneBatchIsInFlight(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	var inFlight, most atomic.Int32
	var mu sync.Mutex
	var sizes []int
	b := newBatcher(4, func(_ context.Context, in []int) ([]int, error) {
		if n := inFlight.Add(1); n > most.Load() {
			most.Store(n)
		}
		defer inFlight.Add(-1)
		mu.Lock()
		sizes = append(sizes, len(in))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			<-release // hold the first batch until the others have queued
		}
		out := make([]int, len(in))
		for i, v := range in {
			out[i] = v * 10
		}
		return out, nil
	})
	b.start(ctx)

	results := make(chan [2]int, 11)
	ask := func(v int) {
		got, err := b.do(context.Background(), v)
		if err != nil {
			t.Error(err)
		}
		results <- [2]int{v, got}
	}
	go ask(0)
	waitFor(t, func() bool { return inFlight.Load() == 1 })
	for v := 1; v <= 10; v++ {
		go ask(v)
	}
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == 10 })
	close(release)
	for range 11 {
		r := <-results
		if r[1] != r[0]*10 {
			t.Errorf("request %d answered %d", r[0], r[1])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) != 4 || sizes[0] != 1 || sizes[1] != 4 || sizes[2] != 4 || sizes[3] != 2 {
		t.Errorf("batch sizes %v, want [1 4 4 2]", sizes)
	}
	if most.Load() != 1 {
		t.Errorf("%d batches were written at once", most.Load())
	}
}

// TestBatcherFailureAnswersTheWholeBatch: a batch that fails fails every
// request in it, and the next batch is written as usual.
func TestBatcherFailureAnswersTheWholeBatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	boom := errors.New("boom")
	var calls atomic.Int32
	b := newBatcher(8, func(_ context.Context, in []int) ([]int, error) {
		if calls.Add(1) == 1 {
			return nil, boom
		}
		return in, nil
	})
	b.start(ctx)
	if _, err := b.do(ctx, 1); !errors.Is(err, boom) {
		t.Fatalf("first request: %v, want the batch's error", err)
	}
	if got, err := b.do(ctx, 2); err != nil || got != 2 {
		t.Fatalf("second request: %d, %v", got, err)
	}
}

// TestBatcherStop: once its context ends the batcher takes no new request,
// still answers the ones it took, and done closes only after the batch in
// flight has been written. A caller that gives up gets its own context's
// error while the batch goes on.
func TestBatcherStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	var writing atomic.Bool
	b := newBatcher(8, func(ctx context.Context, in []int) ([]int, error) {
		writing.Store(true)
		<-release
		return in, ctx.Err()
	})
	b.start(ctx)
	answered := make(chan error, 1)
	go func() { _, err := b.do(context.Background(), 1); answered <- err }()
	waitFor(t, writing.Load)

	callerCtx, giveUp := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { _, err := b.do(callerCtx, 2); gaveUp <- err }()
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == 1 })
	giveUp()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller that gave up got %v", err)
	}

	cancel()
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.closed })
	if _, err := b.do(context.Background(), 3); !errors.Is(err, context.Canceled) {
		t.Fatalf("a request after the stop got %v, want context.Canceled", err)
	}
	select {
	case <-b.done:
		t.Fatal("done closed while a batch was being written")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-answered; !errors.Is(err, context.Canceled) {
		t.Fatalf("the request in flight got %v, want its batch's error", err)
	}
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
		t.Fatal("done never closed")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) != 0 || b.flushing {
		t.Fatalf("after the stop: queue %d, flushing %v", len(b.queue), b.flushing)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(time.Millisecond)
	}
}
