package worker

import (
	"context"
)

// batcher groups requests that arrive while the previous batch is being
// written, and writes them in one round trip (on SQLite, one fsync): group
// commit. An idle worker pays no extra latency: a lone request goes at once.
// The worker has one for claims and one for completions.
type batcher[In, Out any] struct {
	flush    func(ctx context.Context, batch []In) ([]Out, error)
	maxBatch int
	reqs     chan batchItem[In, Out]
	done     chan struct{}
}

type batchItem[In, Out any] struct {
	in     In
	result chan batchResult[Out]
}

type batchResult[Out any] struct {
	out Out
	err error
}

func newBatcher[In, Out any](maxBatch int, flush func(context.Context, []In) ([]Out, error)) *batcher[In, Out] {
	return &batcher[In, Out]{flush: flush, maxBatch: maxBatch, reqs: make(chan batchItem[In, Out]), done: make(chan struct{})}
}

// run writes batches until ctx ends.
func (b *batcher[In, Out]) run(ctx context.Context) {
	defer close(b.done)
	for {
		var batch []batchItem[In, Out]
		select {
		case it := <-b.reqs:
			batch = append(batch, it)
		case <-ctx.Done():
			return
		}
	more:
		for len(batch) < b.maxBatch {
			select {
			case it := <-b.reqs:
				batch = append(batch, it)
			default:
				break more
			}
		}
		ins := make([]In, len(batch))
		for i, it := range batch {
			ins[i] = it.in
		}
		outs, err := b.flush(ctx, ins)
		for i, it := range batch {
			if err != nil {
				it.result <- batchResult[Out]{err: err}
			} else {
				it.result <- batchResult[Out]{out: outs[i]}
			}
		}
	}
}

// do submits one request to the next batch and waits for its answer.
func (b *batcher[In, Out]) do(ctx context.Context, in In) (Out, error) {
	it := batchItem[In, Out]{in: in, result: make(chan batchResult[Out], 1)}
	var zero Out
	select {
	case b.reqs <- it:
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-b.done:
		return zero, context.Canceled
	}
	select {
	case r := <-it.result:
		return r.out, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}
