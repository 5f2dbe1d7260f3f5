package worker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tracing"
)

// publish is step 5: publish the result and wait for JetStream to have it.
// The message id makes a second publication after a crash a no-op. The
// delivery is then answered, as label. While the broker is out it waits,
// and when the drain gives up it hands the job back uncounted; a result the
// broker cannot carry is published in a smaller form (the call took effect:
// its job must still be answered); any other refusal is a counted retry, so
// the job ends in the DLQ rather than looping.
func (d *delivery) publish(r *jobs.Result, label Outcome) verdict {
	subject, msgID := jobs.TenantResultSubject(d.job.Tenant, d.job.ConversationID), jobs.ResultMsgID(d.key, d.job.ToolUseID, answerID(r, d.tool != nil && d.tool.UsesLedger, d.jobSeq()))
	ctx, span := d.child(d.runCtx, "publish toolq.results", trace.SpanKindProducer, func() []attribute.KeyValue {
		return []attribute.KeyValue{tracing.MessagingSystem.String("nats"), tracing.MessagingDestination.String(subject),
			tracing.MessagingMessageID.String(msgID), tracing.MessagingOperation.String("send"),
			tracing.KeyResultStatus.String(string(r.Status)), tracing.KeyDuplicate.Bool(r.Duplicate)}
	})
	defer span.End()
	if d.span.IsRecording() {
		d.span.SetAttributes(tracing.KeyResultStatus.String(string(r.Status)), tracing.KeyDuplicate.Bool(r.Duplicate))
	}
	msg := nats.NewMsg(subject)
	msg.Header.Set(jobs.HeaderKey, d.key)
	d.w.propagator.Inject(ctx, jobs.HeaderCarrier(msg.Header))
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	err := d.sendResult(ctx, msg, r)
	switch {
	case err == nil:
	case transient(err):
		return retryUncounted(d.w.backoff(d), fmt.Errorf("publish result: %w", err))
	default:
		return retryAfter(d.w.backoff(d), fmt.Errorf("publish result: %w", err))
	}
	d.hook(AfterPublish)
	return answered(label)
}

// sendResult publishes r in msg, its headers set, and waits for JetStream
// to have it: every result toolq publishes, to the delivery's tool_use_id
// or to a waiter's, goes through it. r is encoded to fit the broker
// (encodeResult); a result refused for its size all the same (the results
// stream's max message size is lower than the server's) is published in
// its smallest form (smallestResult): the call took effect, and every
// tool_use_id that asked must still be answered. When even that is refused
// the error comes back, a counted retry for the delivery, which ends in the
// DLQ at the delivery limit rather than unanswered.
func (d *delivery) sendResult(ctx context.Context, msg *nats.Msg, r *jobs.Result) error {
	var err error
	if msg.Data, err = encodeResult(r, d.w.payloadLimit(msg), d.w.outputLimit()); err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	send := func() error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := d.w.cfg.JS.PublishMsg(pctx, msg)
		if err != nil && !tooLarge(err) && !refused(err) {
			return &brokerError{err}
		}
		return err
	}
	err = d.durably(ctx, "publish result", send)
	if tooLarge(err) {
		d.w.log.WarnContext(d.ctx, "result too large for the results stream; publishing it without its output and approval args",
			d.attrs("answer_to", r.ToolUseID, "bytes", len(msg.Data), "error", err)...)
		msg.Data, _ = encodeResult(smallestResult(r), 0, 0)
		err = d.durably(ctx, "publish result", send)
	}
	return err
}

// smallestResult is r without what can make it large: its output, which
// encodeResult with no room replaces, and its approval's args (a call's
// args take up to the room an approval takes), replaced the same way by
// {"args_too_large":true,"bytes":N}. The rest of the approval stays, its
// args_digest naming the args; the ledger keeps them whole.
func smallestResult(r *jobs.Result) *jobs.Result {
	if r.Approval == nil {
		return r
	}
	small, a := *r, *r.Approval
	a.Args = json.RawMessage(fmt.Sprintf(`{"args_too_large":true,"bytes":%d}`, len(r.Approval.Args)))
	small.Approval = &a
	return &small
}

// answerID names one answer to one publication of a job, for its result's
// message id (jobs.ResultMsgID): what the result says, of which settlement,
// to the job at which stream sequence (seq). Every delivery of one message
// has its sequence, so a redelivery answering again (its consumer published
// and stopped before its ack) has the same id and JetStream drops it; the
// job published again and taken as new (after the jobs stream's duplicate
// window, which can end inside the results stream's, later by the call's
// duration) is answered under another id, so its agent, waiting for what
// comes after its publication, gets the answer.
//
//   - rejected: the code (unknown_tool, invalid_args, …): nothing ran, and
//     a worker that knows the tool may run the job later;
//   - a call with a ledger row: the status and the row's attempt. A row is
//     settled once per attempt (completed, failed or indeterminate; a
//     resolution changes the status, a release the attempt), and a
//     duplicate answered from the row names the same ones as the delivery
//     that settled it;
//   - a call without one: the status. Each delivery runs the call again;
//     answers with one status are taken as one, as they were before.
func answerID(r *jobs.Result, ledgered bool, seq uint64) string {
	at := ":" + strconv.FormatUint(seq, 10)
	switch {
	case r.Status == jobs.StatusRejected && r.Error != nil:
		return string(r.Status) + ":" + r.Error.Code + at
	case ledgered:
		return string(r.Status) + ":" + strconv.Itoa(r.Attempts) + at
	default:
		return string(r.Status) + at
	}
}

// jobSeq is the job's sequence in its stream (0 when unknown).
func (d *delivery) jobSeq() uint64 {
	if d.meta == nil {
		return 0
	}
	return d.meta.Sequence.Stream
}

// payloadLimit is how large a body the broker takes with msg's headers (and
// the room the traffic around them needs).
func (w *Worker) payloadLimit(msg *nats.Msg) int {
	headers := msg.Size() - len(msg.Subject) - len(msg.Data)
	return int(w.cfg.JS.Conn().MaxPayload()) - headers - 512
}

// resultEnvelope bounds what a result message holds besides its output:
// the ids (bounded by the contract), the key, the flags, an error message
// cut to its first KiB, and the headers (the message id, with a tool_use_id
// of up to 128 characters, the key, the trace context).
const resultEnvelope = 8 << 10

// outputLimit is the largest output a result carries whole: the same for
// every message of every call.
func (w *Worker) outputLimit() int {
	return int(w.cfg.JS.Conn().MaxPayload()) - resultEnvelope
}

// encodeResult encodes r in at most limit bytes. HTML characters are not
// escaped (a web page as output would grow sixfold). An output that does
// not fit is replaced by {"response_too_large":true,"bytes":N}, and an
// error message by its first KiB: the result still says what happened,
// and the ledger keeps the whole output.
func encodeResult(r *jobs.Result, limit, outputLimit int) ([]byte, error) {
	if r.Approval != nil {
		// Every result of a call that waited for a person carries the
		// approval, its args with it, the same in each: the output has that
		// much less room, in every result of the call.
		a, err := marshalApproval(r.Approval)
		if err != nil {
			return nil, fmt.Errorf("approval: %w", err)
		}
		outputLimit -= len(a)
	}
	body, err := marshal(r)
	if err != nil || (len(body) <= limit && len(r.Output) <= outputLimit) {
		return body, err
	}
	small := *r
	// Whether the output fits is decided from the output alone, against a
	// limit that is the same for every message of the call, so that the
	// original and every duplicate (whose envelope and headers are longer)
	// get the same answer.
	if len(r.Output) > outputLimit || limit <= 0 {
		small.Output = json.RawMessage(fmt.Sprintf(`{"response_too_large":true,"bytes":%d}`, len(r.Output)))
	}
	if r.Error != nil && len(r.Error.Message) > 1024 {
		small.Error = &jobs.ResultError{Code: r.Error.Code, Message: strings.ToValidUTF8(r.Error.Message[:1024], "") + "…"}
	}
	return marshal(&small)
}

// tooLarge reports a message the broker refused for its size: over the
// server's max payload, or over the stream's max message size.
func tooLarge(err error) bool {
	var api *jetstream.APIError
	return errors.Is(err, nats.ErrMaxPayload) || (errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum)
}

// refused reports an answer of JetStream about the message (as opposed to
// no answer): retrying it as an outage would loop forever.
func refused(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) || errors.Is(err, nats.ErrBadSubject) || errors.Is(err, nats.ErrPermissionViolation)
}

// publishDeadLetter publishes the message to toolq.dlq.<reason> (a
// tenant's job subject's to toolq.<tenant>.dlq.<reason>): toolq's
// headers (the reason, the error, what the ledger knew of the call), then
// as many of the original's headers as fit, and its body when it fits too.
// What does not fit is named in Toolq-Dlq-Headers-Omitted and
// Toolq-Dlq-Body-Omitted; the original stays whole in TOOLQ_JOBS at
// Toolq-Dlq-Stream-Seq, where requeue finds it. When the DLQ refuses that
// (its own max message size, say), the smallest dead letter, toolq's headers
// alone, is published instead: whatever a message carried, it can be
// dead-lettered. The error comes back when the smallest one is refused too
// (see deadLetterRefused), or the broker did not answer.
func (w *Worker) publishDeadLetter(ctx context.Context, d *delivery, o verdict) error {
	own := w.deadLetterHeaders(ctx, d, o)
	tenant, _ := jobs.SubjectTenant(d.msg.Subject()) // the tenant whose subject it came on: the one who sent it
	msg := nats.NewMsg(jobs.TenantDLQSubject(tenant, o.reason))
	msg.Header = maps.Clone(own)
	if omitted := copyHeaders(msg.Header, d.msg.Headers(), w.headerRoom(own)); len(omitted) > 0 {
		msg.Header.Set(jobs.HeaderDLQHeadersOmitted, cut(strings.Join(omitted, ", "), headerValueLimit))
	}
	msg.Data = d.msg.Data()
	if len(msg.Data) > w.payloadLimit(msg) {
		msg.Header.Set(jobs.HeaderDLQBodyOmitted, strconv.Itoa(len(msg.Data)))
		msg.Data = nil
	}
	err := w.sendDeadLetter(ctx, msg)
	if err == nil || !deadLetterRefused(err) {
		return err
	}
	w.log.WarnContext(d.ctx, "dead letter refused; publishing it with toolq's headers alone", d.attrs("error", err)...)
	return w.sendDeadLetter(ctx, smallestDeadLetter(msg.Subject, own, d.msg))
}

// deadLetterHeaders are toolq's own headers of the dead letter of d.
func (w *Worker) deadLetterHeaders(ctx context.Context, d *delivery, o verdict) nats.Header {
	var seq uint64
	if d.meta != nil {
		seq = d.meta.Sequence.Stream
	}
	h := nats.Header{}
	h.Set(jobs.HeaderDLQReason, o.reason)
	h.Set(jobs.HeaderDLQDetail, cut(oneLine(o.err.Error()), headerValueLimit))
	h.Set(jobs.HeaderDLQSubject, d.msg.Subject())
	h.Set(jobs.HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	h.Set(jobs.HeaderDLQDeliveries, strconv.Itoa(d.deliveries))
	h.Set(jobs.HeaderDLQConsumer, w.consumer.CachedInfo().Name)
	if d.key != "" {
		if row, err := w.cfg.Ledger.Get(ctx, d.key); err == nil {
			h.Set(jobs.HeaderDLQHistory, cut(oneLine(fmt.Sprintf("key=%s state=%s attempt=%d failures=%d owner=%s error=%s", row.Key, row.State, row.Attempt, row.Failures, row.Owner, errorText(row.Error))), headerValueLimit))
		}
	}
	h.Set(jetstream.MsgIDHeader, fmt.Sprintf("dlq:%d:%s", seq, o.reason))
	return h
}

// smallestDeadLetter is the dead letter with toolq's headers alone, saying
// that every original header and the body were omitted.
func smallestDeadLetter(subject string, own nats.Header, orig jetstream.Msg) *nats.Msg {
	msg := nats.NewMsg(subject)
	msg.Header = maps.Clone(own)
	var names []string
	for k := range orig.Headers() {
		if copyable(k, own) {
			names = append(names, k)
		}
	}
	if len(names) > 0 {
		slices.Sort(names)
		msg.Header.Set(jobs.HeaderDLQHeadersOmitted, cut(strings.Join(names, ", "), headerValueLimit))
	}
	if n := len(orig.Data()); n > 0 {
		msg.Header.Set(jobs.HeaderDLQBodyOmitted, strconv.Itoa(n))
	}
	return msg
}

func (w *Worker) sendDeadLetter(ctx context.Context, msg *nats.Msg) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := w.cfg.JS.PublishMsg(pctx, msg)
	return err
}

// deadLetterRefused reports an answer about the dead letter itself (its
// size, its headers, the DLQ's limits or permissions), as opposed to no
// answer from the broker.
func deadLetterRefused(err error) bool {
	return tooLarge(err) || refused(err) || errors.Is(err, nats.ErrBadHeaderMsg)
}

// jetStreamHeaderLimit is the largest header block a stream stores:
// nats-server refuses a message with more ("header size exceeds maximum
// allowed of 64k", error 10097), whatever its max payload.
const jetStreamHeaderLimit = 1<<16 - 1

// headerRoom is how many bytes of the original's headers a dead letter
// with toolq's headers own can carry: what JetStream and the server take,
// less own, the Toolq-Dlq-*-Omitted headers, and the room the traffic
// around them needs.
func (w *Worker) headerRoom(own nats.Header) int {
	limit := min(jetStreamHeaderLimit, int(w.cfg.JS.Conn().MaxPayload())-512)
	omitted := headerLine(jobs.HeaderDLQHeadersOmitted, strings.Repeat("x", headerValueLimit)+"…") +
		headerLine(jobs.HeaderDLQBodyOmitted, strconv.Itoa(math.MaxInt))
	return limit - headerBlock(own) - omitted
}

// copyHeaders copies to dst the headers of src that fit in room bytes,
// smallest first (so that one large header costs only itself), and
// returns the names of those it left out, sorted. JetStream's control
// headers (Nats-*), which would misdirect the copy, and src's own
// Toolq-Dlq-* headers, which would be taken for the dead letter's, are not
// copied and not named.
func copyHeaders(dst, src nats.Header, room int) (omitted []string) {
	type header struct {
		name string
		size int
	}
	var all []header
	for k, vs := range src {
		if !copyable(k, dst) {
			continue
		}
		size := 0
		for _, v := range vs {
			size += headerLine(k, v)
		}
		all = append(all, header{k, size})
	}
	slices.SortFunc(all, func(a, b header) int { return cmp.Or(cmp.Compare(a.size, b.size), strings.Compare(a.name, b.name)) })
	for _, h := range all {
		if h.size > room || !validHeaderName(h.name) {
			omitted = append(omitted, h.name)
			continue
		}
		dst[h.name] = src[h.name]
		room -= h.size
	}
	slices.Sort(omitted)
	return omitted
}

// copyable reports whether the original's header name may be copied to a
// dead letter with toolq's headers own.
func copyable(name string, own nats.Header) bool {
	_, ours := own[name]
	return !ours && !strings.HasPrefix(name, "Nats-") && !strings.HasPrefix(name, "Toolq-Dlq-")
}

// headerBlock is the size of h on the wire.
func headerBlock(h nats.Header) int {
	size := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			size += headerLine(k, v)
		}
	}
	return size
}

// headerLine is the size of the line "name: value\r\n" on the wire.
func headerLine(name, value string) int {
	return len(name) + len(textproto.TrimString(value)) + len(": \r\n")
}

// validHeaderName reports whether nats.go publishes a header of that name
// (printable ASCII without separators); a message published by another
// client may carry others, which nats.go refuses to send on.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < '!' || c > '~' || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func errorText(e *ledger.ErrorInfo) string {
	if e == nil {
		return ""
	}
	return e.Code + ": " + e.Message
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// headerValueLimit bounds the dead letter's own headers (the detail, the
// history), whose text comes from errors of any length.
const headerValueLimit = 1 << 10

// cut shortens s to at most n bytes of valid UTF-8, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
