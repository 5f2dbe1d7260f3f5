package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/toolq/toolq/internal/jcs"
)

// NotRun is the tool_result content (a JSON string) of a call whose stream
// was cut before its tool_use block completed: it was never sent to toolq.
const NotRun = "not run (connection lost)"

// Errors of the conversation record.
var (
	ErrTurnCommitted    = errors.New("jobs: turn already committed")
	ErrAttemptAbandoned = errors.New("jobs: attempt abandoned")
	ErrNotNextTurn      = errors.New("jobs: not the conversation's next turn")
)

// Conversation is an agent's record of one conversation: the turns it has
// committed, each with its assistant tool_use blocks and one tool_result per
// block, and the ids of the attempts it abandoned. A turn is committed once;
// its index is the number of turns committed before it.
type Conversation struct {
	ID      string
	results *Results

	mu        sync.Mutex
	turns     []*CommittedTurn
	abandoned map[string]bool // tool_use_ids of abandoned attempts and cut calls
	notRun    int
}

// CommittedTurn is one turn as it stands in the record.
type CommittedTurn struct {
	Index       int64
	ToolUses    []ToolCall   // the assistant turn's tool_use blocks, in order
	ToolResults []ToolResult // one per tool use, in the same order
}

// NewConversation starts the record of a conversation whose jobs are
// published through r's client and whose results are read by r.
func (r *Results) NewConversation(id string) *Conversation {
	return &Conversation{ID: id, results: r, abandoned: map[string]bool{}}
}

// Turns returns the committed turns.
func (c *Conversation) Turns() []*CommittedTurn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*CommittedTurn(nil), c.turns...)
}

// NotRunCalls is the number of calls recorded as not run because their
// stream was cut before their block completed.
func (c *Conversation) NotRunCalls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.notRun
}

// Turn is the turn after the last committed one, to be played in attempts.
type Turn struct {
	conv  *Conversation
	Index int64

	mu         sync.Mutex
	attempts   []*Attempt
	committing bool
	committed  bool
	winner     *Attempt // the attempt committed, or being committed
}

// NextTurn starts the turn after the last committed one. Until it commits,
// it is the conversation's next turn; a turn given up is simply left.
func (c *Conversation) NextTurn() *Turn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &Turn{conv: c, Index: int64(len(c.turns))}
}

// Attempt is one streamed response of the turn. Each tool_use block is
// either dispatched when it completes or, if the stream was cut first,
// recorded as not run.
type Attempt struct {
	turn      *Turn
	uses      []attemptUse
	ordinals  map[string]int64
	abandoned bool
}

type attemptUse struct {
	call       ToolCall
	dispatched bool
	aw         *Awaiting // the reader's expectation of its result; nil when cut
	// republished: JetStream dropped the job as an exact re-publication, so
	// its result may have come before the reader started (the agent
	// restarted and replays its record): Commit reads it from the
	// conversation's start.
	republished bool
}

// Attempt starts a new attempt of the turn; the previous ones are abandoned
// (the model's retry of a turn emits its calls again with new ids).
func (t *Turn) Attempt() *Attempt {
	t.mu.Lock()
	prev := t.attempts
	a := &Attempt{turn: t, ordinals: map[string]int64{}}
	t.attempts = append(t.attempts, a)
	t.mu.Unlock()
	for _, p := range prev {
		p.Abandon()
	}
	return a
}

// Dispatch publishes a completed tool_use block as a job, with the next
// ordinal among identical calls of this attempt, while the stream goes on.
// A call dispatched again with the same tool_use_id (an agent replaying its
// record after a restart) is dropped by JetStream as a re-publication and
// reports Published.Duplicate; Commit still finds its result. Errors:
// ErrTurnCommitted once the turn is committed or being committed,
// ErrAttemptAbandoned, a *FieldError, or the publish error; after a publish
// error the attempt is abandoned: retry the turn (the retry's call has the
// same key, so it runs at most once).
func (a *Attempt) Dispatch(ctx context.Context, call ToolCall) (Published, error) {
	t := a.turn
	t.mu.Lock()
	switch {
	case t.committed || t.committing:
		// Commit has taken the turn's calls: this one would run without
		// ever being in the record.
		t.mu.Unlock()
		return Published{}, ErrTurnCommitted
	case a.abandoned:
		t.mu.Unlock()
		return Published{}, ErrAttemptAbandoned
	}
	canon, err := jcs.CanonicalizeObject(call.Args)
	if err != nil {
		t.mu.Unlock()
		return Published{}, &FieldError{Field: "args", Rule: "of " + call.ToolUseID + " must be a canonicalizable JSON object", Err: err}
	}
	identity := call.Tool + "|" + string(canon)
	ordinal := a.ordinals[identity]
	a.ordinals[identity]++
	aw := t.conv.results.ExpectIn(t.conv.ID, call.ToolUseID)
	use := len(a.uses)
	a.uses = append(a.uses, attemptUse{call: call, dispatched: true, aw: aw})
	t.mu.Unlock()
	j := &Job{ConversationID: t.conv.ID, TurnIndex: t.Index, Ordinal: ordinal, Tool: call.Tool, ToolUseID: call.ToolUseID, Args: call.Args}
	pub, err := t.conv.results.client.Publish(ctx, j)
	if err != nil {
		a.Abandon() // whether it reached the stream is unknown: the turn is retried
		return pub, err
	}
	if pub.Duplicate {
		t.mu.Lock()
		a.uses[use].republished = true
		t.mu.Unlock()
		aw.Cancel() // its result may never pass the reader again
	}
	return pub, nil
}

// Cut records a tool_use block that the stream's failure cut before it
// completed: the call is not sent to toolq, and the record says NotRun.
func (a *Attempt) Cut(call ToolCall) {
	a.turn.mu.Lock()
	a.uses = append(a.uses, attemptUse{call: call})
	a.turn.mu.Unlock()
}

// Abandon gives the attempt up: results addressed to its ids are dropped,
// and it can no longer be committed. Abandoning twice does nothing.
func (a *Attempt) Abandon() {
	t := a.turn
	t.mu.Lock()
	if a.abandoned || a == t.winner {
		t.mu.Unlock()
		return
	}
	a.abandoned = true
	uses := a.uses
	t.mu.Unlock()
	for _, u := range uses {
		if u.aw != nil {
			u.aw.Cancel()
		}
	}
	c := t.conv
	c.mu.Lock()
	for _, u := range uses {
		c.abandoned[u.call.ToolUseID] = true
		if !u.dispatched {
			c.notRun++
		}
	}
	c.mu.Unlock()
}

// Commit waits for the results addressed to this attempt's ids and appends
// the turn to the conversation: its tool_use blocks and one tool_result per
// block, NotRun for a block that was cut. A call awaiting a person's
// approval is committed with its pending result (a tool_result that says
// so, not an error: Result.ToolResult) unless UntilFinal is given; its final
// result is Client.Await's with UntilFinal, or Client.Lookup's by its key,
// in a later turn. The other attempts are abandoned. It returns
// ErrTurnCommitted for a turn committed (or being committed) already,
// ErrAttemptAbandoned for an abandoned attempt, ErrNotNextTurn when another
// turn took this index, and ctx's error when ctx ends first (the turn can
// then be committed again).
func (t *Turn) Commit(ctx context.Context, a *Attempt, opts ...AwaitOption) (*CommittedTurn, error) {
	t.mu.Lock()
	switch {
	case t.committed || t.committing:
		t.mu.Unlock()
		return nil, ErrTurnCommitted
	case a.turn != t || a.abandoned:
		t.mu.Unlock()
		return nil, ErrAttemptAbandoned
	}
	t.committing, t.winner = true, a // not abandoned meanwhile by a call to Attempt
	uses := append([]attemptUse(nil), a.uses...)
	others := make([]*Attempt, 0, len(t.attempts))
	for _, o := range t.attempts {
		if o != a {
			others = append(others, o)
		}
	}
	t.mu.Unlock()

	results, err := t.conv.awaitResults(ctx, uses, awaitConfigOf(opts))
	if err != nil {
		t.mu.Lock()
		t.committing, t.winner = false, nil
		t.mu.Unlock()
		return nil, err
	}
	ct := &CommittedTurn{Index: t.Index}
	for _, u := range uses {
		ct.ToolUses = append(ct.ToolUses, u.call)
		if !u.dispatched {
			ct.ToolResults = append(ct.ToolResults, notRunResult(u.call.ToolUseID))
			continue
		}
		ct.ToolResults = append(ct.ToolResults, results[u.call.ToolUseID].ToolResult())
	}

	c := t.conv
	c.mu.Lock()
	if int64(len(c.turns)) != t.Index {
		c.mu.Unlock()
		t.mu.Lock()
		t.committing, t.winner = false, nil
		t.mu.Unlock()
		return nil, ErrNotNextTurn
	}
	c.turns = append(c.turns, ct)
	for _, u := range uses {
		if !u.dispatched {
			c.notRun++
		}
	}
	c.mu.Unlock()
	t.mu.Lock()
	t.committed, t.committing = true, false
	t.mu.Unlock()
	for _, u := range uses {
		if u.aw != nil {
			u.aw.Cancel() // the record has its result; a pending one's final is not kept
		}
	}
	for _, o := range others {
		o.Abandon()
	}
	return ct, nil
}

// awaitResults waits for the results of the dispatched uses, by
// tool_use_id: through the reader, and from the conversation's start for
// those JetStream dropped as re-publications.
func (c *Conversation) awaitResults(ctx context.Context, uses []attemptUse, wait awaitConfig) (map[string]*Result, error) {
	got := make(map[string]*Result, len(uses))
	var republished []string
	for _, u := range uses {
		switch {
		case !u.dispatched:
		case u.republished:
			republished = append(republished, u.call.ToolUseID)
		default:
			res, err := u.aw.wait(ctx, u.aw.slots[0], wait)
			if err != nil {
				return nil, err
			}
			got[u.call.ToolUseID] = res
		}
	}
	if len(republished) > 0 {
		older, err := c.results.client.awaitAll(ctx, c.ID, republished, 0, wait)
		if err != nil {
			return nil, err
		}
		for id, res := range older {
			got[id] = res
		}
	}
	return got, nil
}

func notRunResult(toolUseID string) ToolResult {
	content, _ := json.Marshal(NotRun)
	return ToolResult{ToolUseID: toolUseID, Content: content, IsError: true}
}

// Check verifies the record: every committed turn has exactly one
// tool_result per tool_use, addressed to that block's id, in order; a call
// that was not run says NotRun and nothing else; and no tool_result is
// addressed to an id of an abandoned attempt. It returns the first breach.
func (c *Conversation) Check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, ct := range c.turns {
		if ct.Index != int64(i) {
			return fmt.Errorf("jobs: conversation %s: turn %d has index %d", c.ID, i, ct.Index)
		}
		if len(ct.ToolResults) != len(ct.ToolUses) {
			return fmt.Errorf("jobs: conversation %s: turn %d has %d tool_use and %d tool_result", c.ID, i, len(ct.ToolUses), len(ct.ToolResults))
		}
		seen := map[string]bool{}
		for k, use := range ct.ToolUses {
			tr := ct.ToolResults[k]
			switch {
			case seen[use.ToolUseID]:
				return fmt.Errorf("jobs: conversation %s: turn %d: tool_use %s twice", c.ID, i, use.ToolUseID)
			case tr.ToolUseID != use.ToolUseID:
				return fmt.Errorf("jobs: conversation %s: turn %d: tool_result for %s where %s was used", c.ID, i, tr.ToolUseID, use.ToolUseID)
			case c.abandoned[tr.ToolUseID]:
				return fmt.Errorf("jobs: conversation %s: turn %d: a result for %s of an abandoned attempt", c.ID, i, tr.ToolUseID)
			case tr.Result == nil && (!tr.IsError || string(tr.Content) != `"`+NotRun+`"`):
				return fmt.Errorf("jobs: conversation %s: turn %d: %s has a result toolq never sent", c.ID, i, use.ToolUseID)
			case tr.Result != nil && tr.Result.ToolUseID != use.ToolUseID:
				return fmt.Errorf("jobs: conversation %s: turn %d: the result of %s is addressed to %s", c.ID, i, use.ToolUseID, tr.Result.ToolUseID)
			}
			seen[use.ToolUseID] = true
		}
	}
	return nil
}
