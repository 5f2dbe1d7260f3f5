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
// uses bounded memory. Await from the start of a conversation is Client.Await.
type Results struct {
	client *Client
	it     *pull.Iter

	mu      sync.Mutex
	waiting map[waitKey]chan *Result
	err     error // set once the reader stops
	done    chan struct{}
}

// Results starts a reader of the results published from now on whose
// subject matches filter (empty: toolq.results.>, every conversation).
// Expect a tool_use_id before publishing its job, so that its result cannot
// pass unseen. Errors: the consumer could not be created.
func (c *Client) Results(ctx context.Context, filter string) (*Results, error) {
	if filter == "" {
		filter = ResultsSubjects
	}
	cons, err := c.js.OrderedConsumer(ctx, ResultsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: results reader: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("jobs: results reader: %w", err)
	}
	r := &Results{client: c, it: pull.New(it, c.js.Conn()), waiting: map[waitKey]chan *Result{}, done: make(chan struct{})}
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
		if err != nil {
			continue
		}
		r.mu.Lock()
		k := waitKey{res.ConversationID, res.ToolUseID}
		ch, ok := r.waiting[k]
		if !ok {
			k = waitKey{"", res.ToolUseID}
			ch, ok = r.waiting[k]
		}
		delete(r.waiting, k)
		r.mu.Unlock()
		if ok {
			ch <- res // buffered: never blocks
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
	chs          []chan *Result
	got          []*Result // what Wait read, kept for a Wait tried again
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
	a := &Awaiting{r: r, conversation: conversationID, ids: toolUseIDs, chs: make([]chan *Result, len(toolUseIDs)), got: make([]*Result, len(toolUseIDs))}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, id := range toolUseIDs {
		a.chs[i] = make(chan *Result, 1)
		r.waiting[waitKey{conversationID, id}] = a.chs[i]
	}
	return a
}

// Wait returns the results of the expected ids, in their order. It returns
// ctx's error when ctx ends first, and ErrResultsClosed (wrapping the
// reader's error) when the reader stopped, with the results that came; a
// Wait tried again keeps those and waits for the others. Wait is not safe
// for concurrent use on one Awaiting.
func (a *Awaiting) Wait(ctx context.Context) ([]*Result, error) {
	for i, ch := range a.chs {
		if a.got[i] != nil {
			continue
		}
		select {
		case res := <-ch:
			a.got[i] = res
		case <-ctx.Done():
			return append([]*Result(nil), a.got...), ctx.Err()
		case <-a.r.done:
			select {
			case res := <-ch:
				a.got[i] = res
				continue
			default:
			}
			a.r.mu.Lock()
			err := a.r.err
			a.r.mu.Unlock()
			return append([]*Result(nil), a.got...), fmt.Errorf("%w: %v", ErrResultsClosed, err)
		}
	}
	return append([]*Result(nil), a.got...), nil
}

// Cancel stops keeping the ids' results: those that come later are dropped.
func (a *Awaiting) Cancel() {
	a.r.mu.Lock()
	defer a.r.mu.Unlock()
	for i, id := range a.ids {
		if k := (waitKey{a.conversation, id}); a.r.waiting[k] == a.chs[i] {
			delete(a.r.waiting, k)
		}
	}
}
