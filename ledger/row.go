package ledger

// The ledger: rows and their states.

import (
	"encoding/json"
	"time"
)

// State is the state of a ledger row.
type State string

// The states of a row (docs/design.md, "The ledger row").
const (
	InFlight      State = "in_flight"     // claimed; the holder's lease says until when
	Completed     State = "completed"     // the tool succeeded; Result is its output
	Failed        State = "failed"        // the tool failed definitely; Error says why
	Indeterminate State = "indeterminate" // the outcome is unknown; an operator resolves it
	// AwaitingApproval: the call needs a person's approval and has not run;
	// Approval says what was asked, ApprovalExpiresAt until when.
	AwaitingApproval State = "awaiting_approval"
)

// Valid reports whether s is one of the five states.
func (s State) Valid() bool {
	switch s {
	case InFlight, Completed, Failed, Indeterminate, AwaitingApproval:
		return true
	}
	return false
}

// Fence identifies one claim of a key: a write whose attempt or token is not
// the row's fails with ErrFenced. The token is what makes it one claim: a
// claim lost in a crash of the database (Claim.AsyncCommit) is made again
// at the same attempt, and the token tells the two holders apart.
type Fence struct {
	Key     string
	Attempt int64
	Token   string
}

// Row is one ledger row.
type Row struct {
	Key            string          `json:"key"`
	ConversationID string          `json:"conversation_id"`
	TurnIndex      int64           `json:"turn_index"`
	Tool           string          `json:"tool"`
	Ordinal        int64           `json:"ordinal"`
	ArgsDigest     string          `json:"args_digest"`
	State          State           `json:"state"`
	Attempt        int64           `json:"attempt"`
	Owner          string          `json:"owner"`
	LeaseUntil     time.Time       `json:"lease_until"`
	FirstToolUseID string          `json:"first_tool_use_id"`
	TraceID        string          `json:"trace_id,omitempty"`
	SpanID         string          `json:"span_id,omitempty"`
	Result         json.RawMessage `json:"result,omitempty"`
	Error          *ErrorInfo      `json:"error,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	// LeaseRemaining is how long the lease still runs by the database's
	// clock when the row was read; zero once it has expired.
	LeaseRemaining time.Duration `json:"lease_remaining_ms"`
	// Failures counts the call's tries that ended unsettled for a reason of
	// their own (see Store.CountFailures); ClaimToken is the Token of the
	// claim or takeover that took the row.
	Failures   int64  `json:"failures"`
	ClaimToken string `json:"-"`
	// History is the operators' decisions on the row, oldest first.
	History []Event `json:"history,omitempty"`
	// AnsweredAt is when the row last recorded that it answered a
	// duplicate (zero: never): an answer is recorded only when this and
	// UpdatedAt are both more than answeredEvery old. A purge counts the
	// retention from the later of the two, less answeredEvery.
	AnsweredAt time.Time `json:"answered_at,omitzero"`
	// ApprovalStatus is "" for a call that never needed approval, else
	// where its approval is (the ApprovalStatus constants); it survives the
	// release of an approved call. Approval is the request, for a call that
	// needed approval; Waiters the tool_use_ids that asked while it waited
	// and have not had the final answer yet.
	ApprovalStatus    ApprovalStatus `json:"approval_status,omitempty"`
	ApprovalExpiresAt time.Time      `json:"approval_expires_at,omitzero"`
	Approval          *ApprovalInfo  `json:"approval,omitempty"`
	Waiters           []string       `json:"waiters,omitempty"`
	// ApprovalAttempt is the row's attempt when the call was approved: a
	// claim to run it since has a later one.
	ApprovalAttempt int64 `json:"approval_attempt,omitempty"`
	// Tenant is the tenant whose call it is ("" the default).
	Tenant string `json:"tenant,omitempty"`
}

// answeredEvery is how far a row's recorded times (the later of
// Row.UpdatedAt and Row.AnsweredAt) may lag its last answer. A claim that
// answers a duplicate from a settled row writes answered_at only when both
// are older than this, so that a duplicate writes nothing while its row
// settled, or recorded an answer, within the hour (a retried turn's
// duplicate comes seconds after its call: it is one read, with no
// transaction id and no WAL), and a key's duplicates cost a write an hour
// at most. A purge counts the retention from the later of the two, less
// this much: it keeps every row up to an hour longer than its retention,
// and never purges one sooner than its retention after its last answer.
const answeredEvery = time.Hour

// Event is one operator decision recorded in a row's history.
type Event struct {
	At       time.Time       `json:"at"`
	By       string          `json:"by"`
	Action   string          `json:"action"`   // "resolve"
	Decision string          `json:"decision"` // "completed" or "not_run"
	Reason   string          `json:"reason"`
	From     State           `json:"from"`            // the row's state before
	Error    *ErrorInfo      `json:"error,omitempty"` // the error it recorded then
	Output   json.RawMessage `json:"output,omitempty"`
	// Digest is the args digest an approval decision was taken on, Group
	// the approver group it was taken for.
	Digest string `json:"digest,omitempty"`
	Group  string `json:"group,omitempty"`
	// Attempt is the row's attempt when an approval decision or a
	// resolution was taken: a claim after it has a later one.
	Attempt int64 `json:"attempt,omitempty"`
}

// The decisions of a resolution, as recorded in Event.Decision.
const (
	DecisionCompleted = "completed"
	DecisionNotRun    = "not_run"
)

// LastResolution returns the latest resolve event of the row's history, or
// nil when it was never resolved.
func (r *Row) LastResolution() *Event {
	for i := len(r.History) - 1; i >= 0; i-- {
		if r.History[i].Action == "resolve" {
			return &r.History[i]
		}
	}
	return nil
}

// Fence returns the fence of the row's current attempt.
func (r *Row) Fence() Fence { return Fence{Key: r.Key, Attempt: r.Attempt, Token: r.ClaimToken} }

// LeaseExpired reports whether the row is in flight with its lease run out.
func (r *Row) LeaseExpired() bool { return r.State == InFlight && r.LeaseRemaining <= 0 }

// ErrorInfo is the error recorded with a failed, ambiguous or indeterminate
// attempt.
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func encodeError(e ErrorInfo) string {
	b, _ := json.Marshal(e)
	return string(b)
}

// scanRow reads the columns of queries.cols, after the leading ones if any.
// What the columns are read into is one value, so that a row costs one
// allocation for them (each local whose address the scan takes was one of
// its own); the JSON columns are read as bytes, copied once.
func scanRow(sc scanner, r *Row, leading ...any) error {
	var v struct {
		state, approvalStatus, approval, waiters                          string
		result, errText, history                                          []byte
		leaseMS, remainingMS, createdMS, updatedMS, answeredMS, expiresMS int64
		dest                                                              [29]any // the 28 columns and one leading
	}
	dest := append(append(v.dest[:0], leading...), &r.Key, &r.ConversationID, &r.TurnIndex, &r.Tool, &r.Ordinal, &r.ArgsDigest, &v.state,
		&r.Attempt, &r.Owner, &v.leaseMS, &v.remainingMS, &r.FirstToolUseID, &r.TraceID, &r.SpanID, &v.result,
		&v.errText, &v.createdMS, &v.updatedMS, &v.history, &r.Failures, &r.ClaimToken, &v.answeredMS,
		&v.approvalStatus, &v.expiresMS, &v.approval, &v.waiters, &r.ApprovalAttempt, &r.Tenant)
	if err := sc.Scan(dest...); err != nil {
		return err
	}
	scanApproval(r, v.approvalStatus, v.expiresMS, v.approval, v.waiters)
	r.History = nil
	if len(v.history) > 0 && string(v.history) != "[]" {
		if err := json.Unmarshal(v.history, &r.History); err != nil {
			r.History = []Event{{Action: "unreadable", Reason: string(v.history)}}
		}
	}
	r.State = State(v.state)
	r.LeaseUntil = time.UnixMilli(v.leaseMS).UTC()
	r.LeaseRemaining = time.Duration(max(v.remainingMS, 0)) * time.Millisecond
	r.CreatedAt = time.UnixMilli(v.createdMS).UTC()
	r.UpdatedAt = time.UnixMilli(v.updatedMS).UTC()
	r.AnsweredAt = time.Time{}
	if v.answeredMS > 0 {
		r.AnsweredAt = time.UnixMilli(v.answeredMS).UTC()
	}
	r.Result = nil
	if len(v.result) > 0 {
		r.Result = json.RawMessage(v.result)
	}
	r.Error = nil
	if len(v.errText) > 0 {
		r.Error = new(ErrorInfo)
		if json.Unmarshal(v.errText, r.Error) != nil {
			r.Error = &ErrorInfo{Code: "unknown", Message: string(v.errText)}
		}
	}
	return nil
}

// stateReleased is the state of a row whose claim was given up; to every
// reader but Resolve the key has no row.
const stateReleased State = "released"
