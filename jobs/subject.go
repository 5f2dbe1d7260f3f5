package jobs

import (
	"bytes"
	"io"
)

// Stream names.
const (
	JobsStream    = "TOOLQ_JOBS"
	ResultsStream = "TOOLQ_RESULTS"
	DLQStream     = "TOOLQ_DLQ"
)

// Subject prefixes and wildcards.
const (
	JobsPrefix    = "toolq.jobs."
	ResultsPrefix = "toolq.results."
	DLQPrefix     = "toolq.dlq."

	JobsSubjects    = JobsPrefix + ">"
	ResultsSubjects = ResultsPrefix + ">"
	DLQSubjects     = DLQPrefix + ">"
)

// Header names.
const (
	HeaderKey      = "Toolq-Key"       // the key the publisher derived; the consumer checks it
	HeaderReplayOf = "Toolq-Replay-Of" // on replays: the stream sequence of the original
	HeaderMsgID    = "Nats-Msg-Id"     // JetStream's de-duplication id
)

// JobSubject is the subject a job for tool is published on. The tool name must
// be valid (see Call.Validate); it then contains no subject wildcard.
func JobSubject(tool string) string { return JobsPrefix + tool }

// ResultSubject is the subject the results of a conversation are published on.
func ResultSubject(conversationID string) string { return ResultsPrefix + conversationID }

// DLQSubject is the subject a dead letter with the given reason goes to.
func DLQSubject(reason string) string { return DLQPrefix + reason }

// JobMsgID is the Nats-Msg-Id of a job, so that JetStream drops an exact
// re-publication of the same job inside its duplicate window.
func JobMsgID(key, toolUseID string) string { return "job:" + key + ":" + toolUseID }

// ResultMsgID is the Nats-Msg-Id of a result: result:<key>:<tool_use_id>:<answer>,
// where answer names which answer to which publication of the job it is
// (the worker's answerID: the status, the ledger row's attempt or the
// rejection's code, and the job's stream sequence). The same answer
// published again (by a consumer that published it and stopped before its
// ack, answering the redelivery from the ledger) has the same id, and
// JetStream drops it; another answer to the same job (the call run after it
// was rejected, or again after an operator resolved it as not run), or an
// answer to the job published again, has another, and reaches the agent.
func ResultMsgID(key, toolUseID, answer string) string {
	return "result:" + key + ":" + toolUseID + ":" + answer
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// Headers of a dead letter, beside the original message's own.
const (
	HeaderDLQReason     = "Toolq-Dlq-Reason"     // why: invalid, too_large, max_deliver
	HeaderDLQDetail     = "Toolq-Dlq-Detail"     // one line: the error
	HeaderDLQSubject    = "Toolq-Dlq-Subject"    // the original subject
	HeaderDLQStreamSeq  = "Toolq-Dlq-Stream-Seq" // the original's sequence in TOOLQ_JOBS
	HeaderDLQDeliveries = "Toolq-Dlq-Deliveries" // how many times it was delivered
	HeaderDLQConsumer   = "Toolq-Dlq-Consumer"   // the durable that gave up on it
	HeaderDLQHistory    = "Toolq-Dlq-History"    // what the ledger knew of the call, if anything
	// HeaderDLQBodyOmitted is set, to the body's size in bytes, on a dead
	// letter whose original would not fit in the DLQ with its headers: its
	// body is then empty, and the original stays the job at
	// Toolq-Dlq-Stream-Seq in TOOLQ_JOBS.
	HeaderDLQBodyOmitted = "Toolq-Dlq-Body-Omitted"
	// HeaderDLQHeadersOmitted is set on a dead letter that could not carry
	// all of the original's headers (JetStream stores at most 64 KiB of
	// headers, and the dead letter adds its own) to the names of those it
	// dropped, comma-separated and cut to 1 KiB ("…" marks the cut); the
	// original keeps them, at Toolq-Dlq-Stream-Seq in TOOLQ_JOBS.
	HeaderDLQHeadersOmitted = "Toolq-Dlq-Headers-Omitted"
)

// Reasons a job is dead-lettered.
const (
	DLQInvalid    = "invalid"     // not a valid job: never run
	DLQTooLarge   = "too_large"   // over the consumer's body size limit
	DLQMaxDeliver = "max_deliver" // still unsettled after the delivery limit
)
