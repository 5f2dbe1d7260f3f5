package jobs

import (
	"encoding/json"
	"time"
)

// The approvals stream and subjects (docs/approvals.md).
const (
	ApprovalsStream   = "TOOLQ_APPROVALS"
	ApprovalsPrefix   = "toolq.approvals."
	ApprovalsSubjects = ApprovalsPrefix + ">"
	// DecidePrefix is where decisions are requested: toolq.decide.<group>,
	// a subject that only the approvers of the group may publish on.
	DecidePrefix = "toolq.decide."
	// DefaultApprovalsMaxAge is how long the approvals stream keeps its
	// events: beyond the longest approval ttl (30 days).
	DefaultApprovalsMaxAge = 31 * 24 * time.Hour
)

// HeaderApproval is set on the job toolq publishes again once a call
// awaiting approval is decided ("approved", "denied", "expired"): its
// delivery runs the approved call, or answers the waiters.
const HeaderApproval = "Toolq-Approval"

// ApprovalSubject is the subject a conversation's approval events are
// published on.
func ApprovalSubject(conversationID string) string { return ApprovalsPrefix + conversationID }

// DecideSubject is the subject decisions for an approver group are
// requested on.
func DecideSubject(group string) string { return DecidePrefix + group }

// The events of the approvals stream.
const (
	ApprovalRequested = "requested"
	ApprovalApproved  = "approved"
	ApprovalDenied    = "denied"
	ApprovalExpired   = "expired"
)

// ResultApproval is what a result says of the approval of its call.
type ResultApproval struct {
	Args        json.RawMessage `json:"args"` // the canonical args (RFC 8785) that run if approved
	ArgsDigest  string          `json:"args_digest"`
	Group       string          `json:"group"` // the approver group that decides
	RequestedAt time.Time       `json:"requested_at"`
	ExpiresAt   time.Time       `json:"expires_at"`
	// Once decided: approved, denied or expired, by whom, why, when.
	Decision  string    `json:"decision,omitempty"`
	DecidedBy string    `json:"decided_by,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	DecidedAt time.Time `json:"decided_at,omitzero"`
}

// ApprovalEvent is one message of the approvals stream, on
// toolq.approvals.<conversation_id>: a call asked for approval
// (Event "requested"), or was decided ("approved", "denied", "expired").
type ApprovalEvent struct {
	Version        int             `json:"version"`
	Event          string          `json:"event"`
	Key            string          `json:"key"`
	ConversationID string          `json:"conversation_id"`
	TurnIndex      int64           `json:"turn_index"`
	Ordinal        int64           `json:"ordinal"`
	Tool           string          `json:"tool"`
	ToolUseID      string          `json:"tool_use_id"` // the first that asked
	Args           json.RawMessage `json:"args"`        // canonical
	ArgsDigest     string          `json:"args_digest"`
	Group          string          `json:"group"`
	RequestedAt    time.Time       `json:"requested_at"`
	ExpiresAt      time.Time       `json:"expires_at"`
	By             string          `json:"by,omitempty"`
	Reason         string          `json:"reason,omitempty"`
	DecidedAt      time.Time       `json:"decided_at,omitzero"`
}

// ApprovalEventMsgID is the Nats-Msg-Id of an approval event: one event of
// each kind per call.
func ApprovalEventMsgID(key, event string) string { return "approval:" + key + ":" + event }

// DecisionRequest is the body of a request on toolq.decide.<group>.
type DecisionRequest struct {
	Key      string `json:"key"`
	Decision string `json:"decision"` // "approve" or "deny"
	By       string `json:"by"`
	Reason   string `json:"reason"`
	// Digest, when set, is the args digest the approver saw; a call with
	// other args is refused.
	Digest string `json:"digest,omitempty"`
}

// DecisionReply answers a DecisionRequest: the call's approval as it
// stands ("approved", "denied", "expired"), or why the decision was
// refused.
type DecisionReply struct {
	Key    string       `json:"key"`
	Status string       `json:"status,omitempty"`
	Error  *ResultError `json:"error,omitempty"`
}
