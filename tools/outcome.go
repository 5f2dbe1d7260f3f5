package tools

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Outcome is what the consumer needs to know of a tool call that returned:
// docs/design.md's step 5 in four kinds. Every executor's errors map onto them
// through Classify.
type Outcome int

const (
	// Success: the tool ran and answered yes; its output is the result.
	Success Outcome = iota
	// NotSent: nothing reached the downstream (connection refused, DNS
	// failure, breaker open, rate-limited before processing). Nothing
	// happened: release the claim and retry after the delay.
	NotSent
	// Definite: the downstream answered no. That answer is the call's result.
	Definite
	// Ambiguous: the request may have taken effect (timeout after sending,
	// connection reset mid-response, 5xx). A keyed write retries with the
	// same key; an unkeyed write becomes indeterminate.
	Ambiguous
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case NotSent:
		return "not_sent"
	case Definite:
		return "definite"
	case Ambiguous:
		return "ambiguous"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// Error is a classified failure of a tool call. Executors return it (through
// NotSentError, DefiniteError and AmbiguousError) to say which kind of
// failure happened; an executor error of any other type counts as Ambiguous,
// the only safe reading of an unknown failure of a write.
type Error struct {
	Outcome    Outcome
	Code       string        // short machine-readable reason, e.g. "http_422", "connection_refused"
	Message    string        // one line for humans
	RetryAfter time.Duration // NotSent or Ambiguous: when to try again (0: the consumer's default)
	Err        error         // the underlying error, if any
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("tools: %s: %s", e.Outcome, e.Code)
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// Codes of the errors toolq itself gives a call (an executor's own codes,
// such as "http_422", come from the downstream).
const (
	CodeBreakerOpen = "breaker_open" // NotSent: the downstream's circuit breaker refused the call
	CodeCancelled   = "cancelled"    // NotSent before the call started; Ambiguous after
	CodeTimeout     = "timeout"      // Ambiguous: the call outlived its timeout
	CodeNotStarted  = "not_started"  // NotSent: the BeforeSend check stopped the call
	// NotSent: Run was asked to run a transactional_write, which runs with
	// RunTx only.
	CodeTransactional = "transactional"
	// Ambiguous: a transactional executor ended the transaction it was
	// given (a COMMIT or ROLLBACK statement): what it wrote may have
	// committed without the call's ledger row.
	CodeTxEnded = "transaction_ended"
)

// NotSentError says the request never reached the downstream.
func NotSentError(code, message string, retryAfter time.Duration, cause error) *Error {
	return &Error{Outcome: NotSent, Code: code, Message: message, RetryAfter: retryAfter, Err: cause}
}

// DefiniteError says the downstream refused the call.
func DefiniteError(code, message string) *Error {
	return &Error{Outcome: Definite, Code: code, Message: message}
}

// AmbiguousError says the call may or may not have taken effect.
func AmbiguousError(code, message string, retryAfter time.Duration, cause error) *Error {
	return &Error{Outcome: Ambiguous, Code: code, Message: message, RetryAfter: retryAfter, Err: cause}
}

// Classify maps the error of a tool call to its Outcome and returns it as an
// *Error (nil for Success). An *Error anywhere in the chain keeps its
// Outcome. Every other error is Ambiguous, a context's error included:
// context.Canceled gives code "cancelled" and context.DeadlineExceeded code
// "timeout", because Classify cannot know whether the call had started.
// (Tool.Run itself returns NotSent when its ctx ends before the executor
// starts.)
func Classify(err error) (Outcome, *Error) {
	if err == nil {
		return Success, nil
	}
	var te *Error
	if errors.As(err, &te) {
		return te.Outcome, te
	}
	if errors.Is(err, context.Canceled) {
		return Ambiguous, AmbiguousError(CodeCancelled, err.Error(), 0, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Ambiguous, AmbiguousError(CodeTimeout, err.Error(), 0, err)
	}
	return Ambiguous, AmbiguousError("error", err.Error(), 0, err)
}
