// Package simulate plays the streaming-agent scenario that toolq exists
// for: a model response is streamed, each tool_use block is dispatched the
// moment it completes, and the stream may still fail afterwards. The agent
// then retries the turn, and the model emits the same call again with a new
// tool_use_id. The same sequence of failures is played against two
// dispatchers, so their duplicate effects can be compared.
package simulate

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
)

// Call is one tool call of a turn, as the model emits it.
type Call struct {
	ConversationID string
	TurnIndex      int64
	ToolUseID      string // new on every attempt of the turn
	Tool           string
	Args           json.RawMessage
}

// Dispatcher runs a tool call: the naive way (straight to the downstream)
// or through toolq. It returns once the call is dispatched; wait, when true,
// asks it to also wait for the outcome (the attempt whose stream completed).
type Dispatcher interface {
	Dispatch(ctx context.Context, c Call, wait bool) error
}

// Config is the scenario.
type Config struct {
	Turns         int     // turns, each with one payment call
	FailureRate   float64 // probability that a streamed response fails
	AfterDispatch float64 // probability that a failure lands after the call was dispatched
	MaxAttempts   int     // attempts per turn before the agent gives up (default 5)
	Seed          uint64
}

// Stats is what one dispatcher saw.
type Stats struct {
	Turns          int `json:"turns"`
	Attempts       int `json:"attempts"`
	StreamFailures int `json:"stream_failures"`
	AfterDispatch  int `json:"failures_after_dispatch"`
	Dispatches     int `json:"dispatches"`
	GaveUp         int `json:"turns_given_up"`
}

// Run plays the scenario against d and returns what happened, from the
// agent's side; count the effects at the downstream.
func Run(ctx context.Context, cfg Config, conversation string, d Dispatcher) (Stats, error) {
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.FailureRate < 0 || cfg.FailureRate > 1 || cfg.AfterDispatch < 0 || cfg.AfterDispatch > 1 {
		return Stats{}, fmt.Errorf("simulate: rates must be between 0 and 1")
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x70017))
	var st Stats
	for turn := range cfg.Turns {
		st.Turns++
		args, _ := json.Marshal(map[string]any{"invoice_id": fmt.Sprintf("inv_%s_%d", conversation, turn), "amount_cents": 100 + turn, "currency": "EUR"})
		done := false
		for attempt := range cfg.MaxAttempts {
			st.Attempts++
			call := Call{ConversationID: conversation, TurnIndex: int64(turn), Tool: "send_payment", Args: args,
				ToolUseID: fmt.Sprintf("toolu_%s_%d_%d", conversation, turn, attempt)}
			fails := rng.Float64() < cfg.FailureRate
			afterDispatch := rng.Float64() < cfg.AfterDispatch
			switch {
			case !fails: // the stream completes: the call is dispatched and its result awaited
				st.Dispatches++
				if err := d.Dispatch(ctx, call, true); err != nil {
					return st, err
				}
				done = true
			case afterDispatch: // the tool_use block completed and was dispatched, then the stream broke
				st.StreamFailures++
				st.AfterDispatch++
				st.Dispatches++
				if err := d.Dispatch(ctx, call, false); err != nil {
					return st, err
				}
			default: // the stream broke before the block completed: nothing was dispatched
				st.StreamFailures++
			}
			if done {
				break
			}
		}
		if !done {
			st.GaveUp++
		}
	}
	return st, nil
}
