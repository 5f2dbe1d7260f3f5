package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/micro"
)

// LookupSubject is the subject of the consumers' ledger lookup: a NATS
// request whose body is a key, answered with a Lookup (a NATS micro
// service, toolq-ledger, discoverable under $SRV). Who may ask is a NATS
// permission: publishing on it (and subscribing to the reply inbox).
const LookupSubject = "toolq.ledger.get"

// The states a lookup reports: a ledger row's, or LookupUnknown.
const (
	LookupUnknown       = "unknown" // no row: the call never ran, or its row was purged
	LookupInFlight      = "in_flight"
	LookupCompleted     = "completed"
	LookupFailed        = "failed"
	LookupIndeterminate = "indeterminate"
	// LookupAwaitingApproval: the call waits for a person's decision and
	// has not run; Lookup.Approval says what is asked and until when.
	LookupAwaitingApproval = "awaiting_approval"
	// LookupApproved: a person approved the call and it has not run yet;
	// it runs at its job's next delivery.
	LookupApproved = "approved"
)

// Lookup is what the ledger knows of a key: whether the call already
// happened, and how it ended.
type Lookup struct {
	Key   string `json:"key"`
	State string `json:"state"`
	// Attempt is the row's attempt (0 for unknown).
	Attempt int64 `json:"attempt,omitempty"`
	// FirstToolUseID is the tool_use_id that first claimed the call.
	FirstToolUseID string `json:"first_tool_use_id,omitempty"`
	// Output is the tool's output of a completed call.
	Output json.RawMessage `json:"output,omitempty"`
	// Error is the error of a failed, indeterminate or interrupted call.
	Error *ResultError `json:"error,omitempty"`
	// LeaseRemainingMS is how long the holder of an in-flight call keeps it.
	LeaseRemainingMS int64     `json:"lease_remaining_ms,omitempty"`
	UpdatedAt        time.Time `json:"updated_at,omitzero"`
	// Approval is set for a call whose tool asked a person: what was
	// asked, and once decided, the decision (a denied or expired call is
	// failed, with the error approval_denied or approval_expired).
	Approval *ResultApproval `json:"approval,omitempty"`
}

// ErrLookupRefused is a lookup the service answered with an error (a
// malformed key, the ledger unreachable).
var ErrLookupRefused = errors.New("jobs: lookup refused")

// Lookup asks the consumers' ledger lookup service what the ledger knows
// of key: did this call already happen? Errors: ErrLookupRefused (wrapped,
// with the service's code and description), or the request's (no
// consumer answers: nats.ErrNoResponders).
func (c *Client) Lookup(ctx context.Context, key string) (*Lookup, error) {
	msg, err := c.js.Conn().RequestWithContext(ctx, TenantLookupSubject(c.tenant), []byte(key))
	if err != nil {
		return nil, fmt.Errorf("jobs: lookup %s: %w", key, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		return nil, fmt.Errorf("%w: %s %s", ErrLookupRefused, code, msg.Header.Get(micro.ErrorHeader))
	}
	var l Lookup
	if err := json.Unmarshal(msg.Data, &l); err != nil {
		return nil, fmt.Errorf("jobs: lookup %s: %w", key, err)
	}
	return &l, nil
}
