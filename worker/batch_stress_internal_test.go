package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBatcherStress: many callers, some giving up, random flush
// times and failures, and a stop in the middle of it: one batch at a time,
// never more than maxBatch, every request answered with its own result (or
// its batch's error, or its own context's), every do returns, done closes.
func TestBatcherStress(t *testing.T) {
	for round := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		var inFlight atomic.Int32
		var bad atomic.Value
		boom := errors.New("boom")
		b := newBatcher(4, func(fctx context.Context, in []int) ([]int, error) {
			if inFlight.Add(1) != 1 {
				bad.Store("two batches in flight")
			}
			defer inFlight.Add(-1)
			if len(in) == 0 || len(in) > 4 {
				bad.Store(fmt.Sprintf("batch of %d", len(in)))
			}
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
			if fctx.Err() != nil {
				return nil, fctx.Err()
			}
			if rand.IntN(10) == 0 {
				return nil, boom
			}
			out := make([]int, len(in))
			for i, v := range in {
				out[i] = v * 10
			}
			return out, nil
		})
		b.start(ctx)
		var wg sync.WaitGroup
		var answered, refused atomic.Int64
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 200 {
					v := g*1000 + i
					cctx, ccancel := context.WithCancel(context.Background())
					if rand.IntN(20) == 0 {
						ccancel()
					}
					got, err := b.do(cctx, v)
					ccancel()
					switch {
					case err == nil:
						if got != v*10 {
							bad.Store(fmt.Sprintf("request %d answered %d", v, got))
						}
						answered.Add(1)
					case errors.Is(err, boom), errors.Is(err, context.Canceled):
						refused.Add(1)
					default:
						bad.Store(fmt.Sprintf("request %d: %v", v, err))
					}
				}
			}()
		}
		stopAt := int64(500 + rand.IntN(2000))
		for deadline := time.Now().Add(5 * time.Second); answered.Load()+refused.Load() < stopAt && time.Now().Before(deadline); {
			time.Sleep(100 * time.Microsecond)
		}
		cancel()
		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: callers still waiting 10 s after the stop", round)
		}
		select {
		case <-b.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: done never closed", round)
		}
		if v := bad.Load(); v != nil {
			t.Fatalf("round %d: %v", round, v)
		}
		b.mu.Lock()
		if len(b.queue) != 0 || b.flushing {
			t.Fatalf("round %d: queue %d flushing %v after the stop", round, len(b.queue), b.flushing)
		}
		b.mu.Unlock()
		t.Logf("round %d: %d answered, %d refused or failed", round, answered.Load(), refused.Load())
	}
}

// TestBatcherFlushPanic: a flush that panics in the caller that
// writes it. Where the panic is recovered (by whatever runs the caller),
// the batcher must still answer the requests of that batch and the
// requests after it, and close done at the stop.
func TestBatcherFlushPanic(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int32
	b := newBatcher(8, func(_ context.Context, in []int) ([]int, error) {
		if calls.Add(1) == 1 {
			panic("flush panicked")
		}
		return in, nil
	})
	b.start(ctx)
	func() {
		defer func() { t.Logf("recovered: %v", recover()) }()
		b.do(context.Background(), 1)
	}()
	answered := make(chan error, 1)
	go func() { _, err := b.do(context.Background(), 2); answered <- err }()
	select {
	case err := <-answered:
		t.Logf("the next request: %v", err)
	case <-time.After(2 * time.Second):
		b.mu.Lock()
		t.Errorf("the request after the panic is never answered (flushing %v, queue %d)", b.flushing, len(b.queue))
		b.mu.Unlock()
	}
	cancel()
	select {
	case <-b.done:
	case <-time.After(2 * time.Second):
		t.Errorf("done never closes after the panic: worker.Run would not return")
	}
}
