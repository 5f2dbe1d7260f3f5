package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/pull"
)

// ErrResultsClosed is returned by Awaiting.Wait once the Results reader has
// stopped (Close, or its subscription failed).
var ErrResultsClosed = errors.New("jobs: results reader closed")

// Results reads the results stream through one ordered consumer and hands
// each result to whoever awaits its tool_use_id; a result nobody awaits (one
// addressed to an abandoned attempt, or to another agent) is dropped at once.
// It serves any number of turns at the cost of one consumer on the server,
// and holds nothing but the ids awaited, so an agent that plays many turns
// uses bounded memory. An id stays awaited until its final result came or
// its wait is cancelled: past a result awaiting approval, its final result
// is kept too. Await from the start of a conversation is Client.Await.
type Results struct {
	client *Client
	it     *pull.Iter

	mu      sync.Mutex
	waiting map[waitKey]*slot
	err     error // set once the reader stops
	done    chan struct{}
}

// slot is where the reader keeps the latest result of one awaited
// tool_use_id: it stays awaited past a result awaiting approval, whose
// final result follows, and is let go at a final one.
type slot struct {
	res   *Result       // guarded by Results.mu
	ready chan struct{} // signalled (never blocking) when res changes
}

// Results starts a reader of the results published from now on whose
// subject matches filter (empty: toolq.results.>, every conversation; a
// tenant's client: toolq.<tenant>.results.>).
// Expect a tool_use_id before publishing its job, so that its result cannot
// pass unseen. "From now on" is from the stream's next sequence when it is
// called, kept if the reader's consumer is recreated (its node lost) before
// the first result. Errors: the stream or the consumer could not be read.
func (c *Client) Results(ctx context.Context, filter string) (*Results, error) {
	if filter == "" {
		filter = tenantPrefix(c.tenant) + "results.>"
	}
	from, err := c.resultsCursor(ctx)
	if err != nil {
		return nil, fmt.Errorf("jobs: results reader: %w", err)
	}
	cons, err := pull.OrderedConsumer(ctx, c.js, TenantStream(c.tenant, ResultsStream), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    from, // not DeliverNew: a reset before the first result starts here again, not at the reset
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: results reader: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("jobs: results reader: %w", err)
	}
	r := &Results{client: c, it: pull.New(it, c.js.Conn()), waiting: map[waitKey]*slot{}, done: make(chan struct{})}
	go r.read()
	return r, nil
}

func (r *Results) read() {
	defer close(r.done)
	for {
		msg, err := r.it.Next()
		if err != nil {
			r.mu.Lock()
			r.err = err
			r.mu.Unlock()
			return
		}
		res, err := DecodeResult(msg.Data())
		if err != nil || res.Tenant != r.client.tenant {
			continue // another tenant's result is never this reader's (docs/tenants.md)
		}
		r.mu.Lock()
		k := waitKey{res.ConversationID, res.ToolUseID}
		s, ok := r.waiting[k]
		if !ok {
			k = waitKey{"", res.ToolUseID}
			s, ok = r.waiting[k]
		}
		if ok && res.Supersedes(s.res) {
			s.res = res
		}
		if ok && res.Status.Final() {
			delete(r.waiting, k) // nothing follows a final result
		}
		r.mu.Unlock()
		if ok {
			select {
			case s.ready <- struct{}{}:
			default: // already signalled
			}
		}
	}
}

// Close stops the reader; Wait calls still waiting return ErrResultsClosed.
func (r *Results) Close() {
	r.it.Stop()
	<-r.done
}

// Awaiting is a set of tool_use_ids whose results a Results reader keeps.
type Awaiting struct {
	r            *Results
	conversation string
	ids          []string
	slots        []*slot
}

// waitKey is what a wait is for: a tool_use_id of a conversation (""
// for any conversation).
type waitKey struct{ conversation, toolUseID string }

// Expect starts keeping the results addressed to the given tool_use_ids, in
// any conversation. Call it before publishing their jobs; Wait collects
// them, Cancel gives them up. ExpectIn keeps them to one conversation.
func (r *Results) Expect(toolUseIDs ...string) *Awaiting { return r.ExpectIn("", toolUseIDs...) }

// ExpectIn is Expect for the results of one conversation: a tool_use_id
// may recur in another (a replayed model response), whose result is not
// this one's.
func (r *Results) ExpectIn(conversationID string, toolUseIDs ...string) *Awaiting {
	a := &Awaiting{r: r, conversation: conversationID, ids: toolUseIDs, slots: make([]*slot, len(toolUseIDs))}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, id := range toolUseIDs {
		a.slots[i] = &slot{ready: make(chan struct{}, 1)}
		r.waiting[waitKey{conversationID, id}] = a.slots[i]
	}
	return a
}

// Wait returns the results of the expected ids, in their order: the
// latest of each that came, the first result if none came yet; with
// UntilFinal, each id's final result, waiting past one awaiting approval.
// A Wait that returned a result awaiting approval may be called again
// (with UntilFinal) for the final one: the id stays awaited until its
// final result came or Cancel. It returns ctx's error when ctx ends first,
// and ErrResultsClosed (wrapping the reader's error) when the reader
// stopped, with the results that came; a Wait tried again keeps those and
// waits for the others. Wait is not safe for concurrent use on one
// Awaiting.
func (a *Awaiting) Wait(ctx context.Context, opts ...AwaitOption) ([]*Result, error) {
	cfg := awaitConfigOf(opts)
	got := make([]*Result, len(a.slots))
	var err error
	for i, s := range a.slots {
		if got[i], err = a.wait(ctx, s, cfg); err != nil {
			for k := i + 1; k < len(a.slots); k++ {
				got[k] = a.latest(a.slots[k])
			}
			return got, err
		}
	}
	return got, nil
}

// wait waits for a result of s that is enough for cfg; on an error it
// returns the latest result that came, if any.
func (a *Awaiting) wait(ctx context.Context, s *slot, cfg awaitConfig) (*Result, error) {
	for {
		res := a.latest(s)
		if cfg.enough(res) {
			return res, nil
		}
		select {
		case <-s.ready:
		case <-ctx.Done():
			return a.latest(s), ctx.Err()
		case <-a.r.done:
			if res := a.latest(s); cfg.enough(res) {
				return res, nil
			}
			a.r.mu.Lock()
			err := a.r.err
			a.r.mu.Unlock()
			return a.latest(s), fmt.Errorf("%w: %v", ErrResultsClosed, err)
		}
	}
}

func (a *Awaiting) latest(s *slot) *Result {
	a.r.mu.Lock()
	defer a.r.mu.Unlock()
	return s.res
}

// Cancel stops keeping the ids' results: those that come later are
// dropped. An id whose result awaits approval is kept until Cancel or its
// final result.
func (a *Awaiting) Cancel() {
	a.r.mu.Lock()
	defer a.r.mu.Unlock()
	for i, id := range a.ids {
		if k := (waitKey{a.conversation, id}); a.r.waiting[k] == a.slots[i] {
			delete(a.r.waiting, k)
		}
	}
}
