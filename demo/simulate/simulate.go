// Package simulate plays the streaming-agent scenario that toolq exists
// for: a model response is streamed, each tool_use block is dispatched the
// moment it completes, and the stream may still fail. A failure before the
// block completed abandons the call: nothing is dispatched, and the agent
// records it as not run. A failure after the dispatch makes the agent retry
// the turn once, and the model emits the same call again with a new
// tool_use_id. A user may press send again after a turn that failed. The
// same failures are played against two sides, so that their effects can be
// compared: each turn draws its failures from its own generator, seeded by
// the run's seed and the turn's number, so the sides see the same ones
// however their turns interleave.
package simulate

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// Call is one tool call of a turn, as the model emits it.
type Call struct {
	ConversationID string
	TurnIndex      int64
	ToolUseID      string // new on every attempt of the turn
	Tool           string
	Args           json.RawMessage
}

// Side is what the scenario is played against: a naive dispatcher, or toolq.
type Side interface {
	// Conversation starts the record of one conversation; its turns are
	// played in order, by one goroutine.
	Conversation(ctx context.Context, id string) (Conversation, error)
}

// Conversation is one conversation of a side.
type Conversation interface {
	// NextTurn starts the turn after the last committed one.
	NextTurn() Turn
	// Close ends the conversation; it checks the record where the side keeps one.
	Close(ctx context.Context) error
}

// Turn is one turn, played in attempts (streamed responses).
type Turn interface {
	Index() int64
	// Attempt starts a streamed response; the previous one is abandoned.
	Attempt()
	// Dispatch runs a call whose tool_use block completed, without waiting
	// for its outcome.
	Dispatch(ctx context.Context, c Call) error
	// Cut records a call whose block the stream's failure cut: not run.
	Cut(c Call)
	// Complete is called when the attempt's stream completed: wait for the
	// outcomes of its calls and commit the turn.
	Complete(ctx context.Context) error
}

// Config is the scenario.
type Config struct {
	Turns         int     // turns, each with one payment call
	FailureRate   float64 // probability that a streamed response fails
	AfterDispatch float64 // probability that a failure lands after the call was dispatched
	ResendRate    float64 // probability that the user presses send again after a failed turn
	Seed          uint64
	// TurnsPerConversation (default 10) and Concurrency, the conversations
	// played at once (default 32).
	TurnsPerConversation int
	Concurrency          int
	// Prefix starts every conversation id and invoice id (default "sim"),
	// so that runs against shared services do not meet.
	Prefix string
}

// Stats is what one side saw, from the agent's side; count the effects at
// the downstream.
type Stats struct {
	Turns          int `json:"turns"`
	Attempts       int `json:"attempts"`
	StreamFailures int `json:"stream_failures"`
	AfterDispatch  int `json:"failures_after_dispatch"`
	NotRun         int `json:"abandoned_not_run"` // calls cut before dispatch: never published
	Dispatches     int `json:"jobs_published"`
	Resends        int `json:"resends"`
	Committed      int `json:"turns_committed"`
	GaveUp         int `json:"turns_given_up"`
}

func (s *Stats) add(o Stats) {
	s.Turns += o.Turns
	s.Attempts += o.Attempts
	s.StreamFailures += o.StreamFailures
	s.AfterDispatch += o.AfterDispatch
	s.NotRun += o.NotRun
	s.Dispatches += o.Dispatches
	s.Resends += o.Resends
	s.Committed += o.Committed
	s.GaveUp += o.GaveUp
}

func (cfg *Config) fill() error {
	for _, p := range []float64{cfg.FailureRate, cfg.AfterDispatch, cfg.ResendRate} {
		if p < 0 || p > 1 {
			return fmt.Errorf("simulate: rates must be between 0 and 1")
		}
	}
	if cfg.TurnsPerConversation <= 0 {
		cfg.TurnsPerConversation = 10
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "sim"
	}
	return nil
}

// InvoiceID is the invoice that global turn number g pays.
func (cfg Config) InvoiceID(g int) string { return fmt.Sprintf("inv_%s_%d", cfg.Prefix, g) }

// Run plays the scenario against side and returns what happened.
func Run(ctx context.Context, cfg Config, side Side) (Stats, error) {
	if err := cfg.fill(); err != nil {
		return Stats{}, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	convs := (cfg.Turns + cfg.TurnsPerConversation - 1) / cfg.TurnsPerConversation
	var next atomic.Int64
	var mu sync.Mutex
	var total Stats
	var wg sync.WaitGroup
	for range min(cfg.Concurrency, convs) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c := int(next.Add(1) - 1)
				if c >= convs || ctx.Err() != nil {
					return
				}
				st, err := playConversation(ctx, cfg, side, c)
				mu.Lock()
				total.add(st)
				mu.Unlock()
				if err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return total, err
	}
	return total, nil
}

func playConversation(ctx context.Context, cfg Config, side Side, c int) (Stats, error) {
	var st Stats
	id := fmt.Sprintf("%s-%d", cfg.Prefix, c)
	conv, err := side.Conversation(ctx, id)
	if err != nil {
		return st, err
	}
	first := c * cfg.TurnsPerConversation
	for g := first; g < min(first+cfg.TurnsPerConversation, cfg.Turns); g++ {
		if err := playTurn(ctx, cfg, conv, id, g, &st); err != nil {
			return st, err
		}
	}
	return st, conv.Close(ctx)
}

// playTurn plays global turn g: attempts until one completes, the turn
// fails (a failure before dispatch, or a second failure after dispatch),
// and perhaps once more if the user presses send again.
func playTurn(ctx context.Context, cfg Config, conv Conversation, id string, g int, st *Stats) error {
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(g)))
	args, _ := json.Marshal(map[string]any{"invoice_id": cfg.InvoiceID(g), "amount_cents": 100 + g%1000, "currency": "EUR"})
	st.Turns++
	turn := conv.NextTurn()
	retried, resent := false, false
	for attempt := 0; ; attempt++ {
		st.Attempts++
		turn.Attempt()
		call := Call{ConversationID: id, TurnIndex: turn.Index(), Tool: "send_payment", Args: args,
			ToolUseID: fmt.Sprintf("toolu_%d_%d", g, attempt)}
		fails := rng.Float64() < cfg.FailureRate
		afterDispatch := rng.Float64() < cfg.AfterDispatch
		switch {
		case !fails: // the stream completes: the call is dispatched, its result awaited, the turn committed
			st.Dispatches++
			if err := turn.Dispatch(ctx, call); err != nil {
				return err
			}
			if err := turn.Complete(ctx); err != nil {
				return err
			}
			st.Committed++
			return nil
		case afterDispatch: // the block completed and was dispatched, then the stream broke
			st.StreamFailures++
			st.AfterDispatch++
			st.Dispatches++
			if err := turn.Dispatch(ctx, call); err != nil {
				return err
			}
			if !retried { // the agent retries the turn once
				retried = true
				continue
			}
		default: // the stream broke inside the block: the call is abandoned, not run
			st.StreamFailures++
			st.NotRun++
			turn.Cut(call)
		}
		// The turn failed; the user may press send again, once.
		if resent || rng.Float64() >= cfg.ResendRate {
			st.GaveUp++
			return nil
		}
		resent, retried = true, false
		st.Resends++
	}
}
