package jobs

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/toolq/toolq/internal/jcs"
)

// Status is the outcome a Result reports.
type Status string

// The statuses of a Result.
const (
	StatusOK            Status = "ok"            // the tool ran and succeeded
	StatusError         Status = "error"         // the tool ran, or was refused downstream, and failed definitely
	StatusRejected      Status = "rejected"      // nothing ran: unknown tool, invalid args, key mismatch
	StatusIndeterminate Status = "indeterminate" // the outcome is unknown; an operator reconciles it
	// StatusAwaitingApproval: the call needs a person's approval and has
	// not run; Approval says what is asked. Not final: the final result
	// follows when the call is decided and run.
	StatusAwaitingApproval Status = "awaiting_approval"
	StatusDenied           Status = "denied"  // a person denied the call; it never ran
	StatusExpired          Status = "expired" // no decision came before the approval expired; the call never ran
)

// Valid reports whether s is one of the seven statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusOK, StatusError, StatusRejected, StatusIndeterminate, StatusAwaitingApproval, StatusDenied, StatusExpired:
		return true
	}
	return false
}

// Final reports whether a result with status s is the call's last word:
// every status but awaiting_approval.
func (s Status) Final() bool { return s != StatusAwaitingApproval }

// ResultError describes why a call did not succeed.
type ResultError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Result is the body of one message on toolq.results.<conversation_id>: the
// outcome of one job, addressed to that job's tool_use_id.
type Result struct {
	Version           int             `json:"version"`
	Key               string          `json:"key"`
	ConversationID    string          `json:"conversation_id"`
	TurnIndex         int64           `json:"turn_index"`
	Ordinal           int64           `json:"ordinal"`
	Tool              string          `json:"tool"`
	ToolUseID         string          `json:"tool_use_id"`
	Status            Status          `json:"status"`
	Output            json.RawMessage `json:"output,omitempty"`
	Error             *ResultError    `json:"error,omitempty"`
	Duplicate         bool            `json:"duplicate"`
	OriginalToolUseID string          `json:"original_tool_use_id,omitempty"`
	Attempts          int             `json:"attempts"`
	CompletedAt       time.Time       `json:"completed_at"`
	// Approval is set on the results of a call that needed a person's
	// approval: what was asked, and once decided, the decision.
	Approval *ResultApproval `json:"approval,omitempty"`
	// Tenant is the job's tenant; absent for the default tenant.
	Tenant string `json:"tenant,omitempty"`
}

// NewResult starts the result of job j with the given key and status.
func NewResult(j *Job, key string, status Status) *Result {
	return &Result{
		Version:        Version,
		Key:            key,
		Tenant:         j.Tenant,
		ConversationID: j.ConversationID,
		TurnIndex:      j.TurnIndex,
		Ordinal:        j.Ordinal,
		Tool:           j.Tool,
		ToolUseID:      j.ToolUseID,
		Status:         status,
		CompletedAt:    time.Now().UTC(),
	}
}

// DecodeResult decodes a result body, refusing unknown fields, another
// version or an unknown status.
func DecodeResult(body []byte) (*Result, error) {
	if _, err := jcs.ParseStrict(body); err != nil {
		return nil, err
	}
	var r Result
	if err := decodeStrictJSON(body, &r); err != nil {
		return nil, &FieldError{Field: "(body)", Rule: "must be a Result v1", Err: err}
	}
	if r.Version != Version {
		return nil, &FieldError{Field: "version", Rule: fmt.Sprintf("must be %d, got %d", Version, r.Version), Err: ErrVersion}
	}
	if !r.Status.Valid() {
		return nil, &FieldError{Field: "status", Rule: fmt.Sprintf("unknown status %q", r.Status)}
	}
	return &r, nil
}

func decodeStrictJSON(body []byte, v any) error {
	dec := json.NewDecoder(bytesReader(body))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
