package worker

import (
	"context"
	"fmt"
	"sync"
)

// batcher groups requests that arrive while the previous batch is being
// written, and writes them in one round trip (on SQLite, one fsync): group
// commit, one batch in flight at a time. An idle worker pays no extra
// latency: a request that finds nothing in flight is written at once, from
// the caller's own goroutine, with no hand-off to another. The worker has
// one for claims and one for completions.
type batcher[In, Out any] struct {
	flush    func(ctx context.Context, batch []In) ([]Out, error)
	maxBatch int

	mu       sync.Mutex
	idle     sync.Cond // signalled when flushing turns false
	ctx      context.Context
	queue    []batchItem[In, Out] // requests not yet written; never empty unless flushing is false
	flushing bool                 // a batch is being written
	closed   bool                 // ctx ended: no new request is taken
	done     chan struct{}        // closed once closed is set and nothing is in flight
	next     chan struct{}        // the writer goroutine's turn: a batch queued behind the one written (never more than one)
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
	b := &batcher[In, Out]{flush: flush, maxBatch: maxBatch, done: make(chan struct{}), next: make(chan struct{}, 1)}
	b.idle.L = &b.mu
	return b
}

// start takes requests until ctx ends; batches are written under ctx. Once
// it ends, do refuses new requests, the ones already taken are still
// answered (a batch written under an ended context fails), and done closes
// when the last batch has been.
func (b *batcher[In, Out]) start(ctx context.Context) {
	b.mu.Lock()
	b.ctx = ctx
	b.mu.Unlock()
	go func() {
		<-ctx.Done()
		b.mu.Lock()
		b.closed = true
		for b.flushing {
			b.idle.Wait()
		}
		b.mu.Unlock()
		close(b.done)
	}()
	go b.writer()
}

// writer writes the batches that queue up behind the one in flight, one
// after the other, until the batcher is done. One goroutine serves them
// all: its stack has grown to what a write needs, where a new goroutine's
// would grow again, copying itself on the way.
func (b *batcher[In, Out]) writer() {
	for {
		select {
		case <-b.next:
			b.writeNext()
		case <-b.done:
			return
		}
	}
}

// do submits one request to the next batch and waits for its answer. A
// request that finds no batch in flight is written by the caller itself;
// one that does joins the queue that the writer of that batch writes next.
func (b *batcher[In, Out]) do(ctx context.Context, in In) (Out, error) {
	it := batchItem[In, Out]{in: in, result: make(chan batchResult[Out], 1)}
	var zero Out
	b.mu.Lock()
	if b.closed || b.ctx == nil {
		b.mu.Unlock()
		return zero, context.Canceled
	}
	b.queue = append(b.queue, it)
	lead := !b.flushing
	b.flushing = true
	b.mu.Unlock()
	if lead {
		b.writeNext() // the queue was empty: this request is in the batch, and answered when it returns
	}
	select {
	case r := <-it.result:
		return r.out, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// writeNext writes the next batch from the queue and answers its requests.
// Requests that queued up meanwhile are written next by the writer
// goroutine, so that the caller gets its answer without waiting for their
// batch; when none did, nothing is in flight any more.
func (b *batcher[In, Out]) writeNext() {
	b.mu.Lock()
	n := min(len(b.queue), b.maxBatch)
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil // let the written batch's backing array go
	}
	ctx := b.ctx
	b.mu.Unlock()

	ins := make([]In, len(batch))
	for i, it := range batch {
		ins[i] = it.in
	}
	// A write that panics still answers its batch and hands on, so that
	// whoever recovers the panic finds the batcher working.
	defer func() {
		if p := recover(); p != nil {
			err := fmt.Errorf("worker: a batch write panicked: %v", p)
			for _, it := range batch {
				select {
				case it.result <- batchResult[Out]{err: err}:
				default: // already answered
				}
			}
			b.handOn()
			panic(p)
		}
	}()
	outs, err := b.flush(ctx, ins)
	for i, it := range batch {
		if err != nil {
			it.result <- batchResult[Out]{err: err}
		} else {
			it.result <- batchResult[Out]{out: outs[i]}
		}
	}
	b.handOn()
}

// handOn gives the writer goroutine the next batch when requests are
// queued, and otherwise marks the batcher idle. The send never blocks: one
// batch is written at a time, and the writer takes its turn before it
// writes, so the channel is empty whenever a write ends.
func (b *batcher[In, Out]) handOn() {
	b.mu.Lock()
	if len(b.queue) > 0 {
		b.mu.Unlock()
		b.next <- struct{}{}
		return
	}
	b.flushing = false
	b.idle.Broadcast()
	b.mu.Unlock()
}
