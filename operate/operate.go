// Package operate is what an operator does with toolq's streams: list, show,
// requeue and purge the dead letters in TOOLQ_DLQ, and replay history from
// TOOLQ_JOBS through the normal path, where the ledger keeps a settled call
// from running twice. The publisher's dlq and replay commands are built on it.
package operate

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/jcs"
	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// DeadLetter is one message of TOOLQ_DLQ, with what the consumer recorded
// about why it gave up.
type DeadLetter struct {
	Seq        uint64      `json:"seq"`     // in TOOLQ_DLQ
	Time       time.Time   `json:"time"`    // when it was dead-lettered
	Reason     string      `json:"reason"`  // invalid, too_large, max_deliver
	Detail     string      `json:"detail"`  // the error, one line
	Subject    string      `json:"subject"` // where the job was published
	JobSeq     uint64      `json:"job_seq"` // its sequence in TOOLQ_JOBS
	Deliveries int         `json:"deliveries"`
	Consumer   string      `json:"consumer"`
	History    string      `json:"history,omitempty"` // what the ledger knew
	Header     nats.Header `json:"header,omitempty"`  // the original headers
	Body       string      `json:"body,omitempty"`    // the original body
	// BodyOmitted is the size in bytes of a body too large to fit in the
	// DLQ with its headers: Body is then empty, and the original stays the
	// job at JobSeq in TOOLQ_JOBS until that stream's max age.
	BodyOmitted int `json:"body_omitted,omitempty"`
	// HeadersOmitted names the original headers that did not fit in the
	// DLQ beside the dead letter's own (comma-separated, cut at 1 KiB):
	// Header lacks them, and the original in TOOLQ_JOBS has them.
	HeadersOmitted string `json:"headers_omitted,omitempty"`
	ToolUseID      string `json:"tool_use_id,omitempty"`
	Conversation   string `json:"conversation_id,omitempty"`
}

func deadLetterOf(seq uint64, t time.Time, subject string, h nats.Header, data []byte) DeadLetter {
	d := DeadLetter{Seq: seq, Time: t, Reason: h.Get(jobs.HeaderDLQReason), Detail: h.Get(jobs.HeaderDLQDetail),
		Subject: h.Get(jobs.HeaderDLQSubject), Consumer: h.Get(jobs.HeaderDLQConsumer), History: h.Get(jobs.HeaderDLQHistory),
		Header: nats.Header{}, Body: string(data)}
	if d.Reason == "" {
		d.Reason = strings.TrimPrefix(subject, jobs.DLQPrefix)
	}
	d.JobSeq, _ = strconv.ParseUint(h.Get(jobs.HeaderDLQStreamSeq), 10, 64)
	d.Deliveries, _ = strconv.Atoi(h.Get(jobs.HeaderDLQDeliveries))
	if v := h.Get(jobs.HeaderDLQBodyOmitted); v != "" {
		if d.BodyOmitted, _ = strconv.Atoi(v); d.BodyOmitted <= 0 {
			d.BodyOmitted = 1 // omitted, of a size the header does not say
		}
	}
	d.HeadersOmitted = h.Get(jobs.HeaderDLQHeadersOmitted)
	for k, v := range h {
		if !strings.HasPrefix(k, "Toolq-Dlq-") {
			d.Header[k] = v
		}
	}
	if j, err := jobs.DecodeCall(data); err == nil {
		d.Conversation = j.ConversationID
	}
	if id := toolUseIDOf(data); id != "" {
		d.ToolUseID = id
	}
	return d
}

// toolUseIDOf returns the tool_use_id of a body that passes the strict parser
// and is an object with a string tool_use_id, else "".
func toolUseIDOf(body []byte) string {
	v, err := jcs.ParseStrict(body)
	if err != nil || v.Kind != jcs.KindObject {
		return ""
	}
	for _, m := range v.Members {
		if m.Name == "tool_use_id" && m.Value.Kind == jcs.KindString {
			return m.Value.String
		}
	}
	return ""
}

// ListDeadLetters returns the dead letters, oldest first; reason, when not
// empty, keeps only that reason's. An error reading TOOLQ_DLQ comes back
// wrapped, with what was read until then.
func ListDeadLetters(ctx context.Context, js jetstream.JetStream, reason string) ([]DeadLetter, error) {
	filter := jobs.DLQSubjects
	if reason != "" {
		filter = jobs.DLQSubject(reason)
	}
	var out []DeadLetter
	err := scanStream(ctx, js, jobs.DLQStream, filter, jetstream.ConsumerConfig{}, nil, func(m jetstream.Msg) (bool, error) {
		meta, err := m.Metadata()
		if err != nil {
			return false, err
		}
		out = append(out, deadLetterOf(meta.Sequence.Stream, meta.Timestamp, m.Subject(), m.Headers(), m.Data()))
		return true, nil
	})
	return out, err
}

// GetDeadLetter returns the dead letter at seq, or an error when TOOLQ_DLQ
// has none there (or cannot be read).
func GetDeadLetter(ctx context.Context, js jetstream.JetStream, seq uint64) (DeadLetter, error) {
	s, err := streamOf(ctx, js, jobs.DLQStream)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("operate: stream %s: %w", jobs.DLQStream, err)
	}
	m, err := jsretry.Do(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) { return s.GetMsg(ctx, seq) })
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return DeadLetter{}, fmt.Errorf("operate: no dead letter at sequence %d", seq)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("operate: dead letter %d: %w", seq, err)
	}
	return deadLetterOf(m.Sequence, m.Time, m.Subject, m.Header, m.Data), nil
}

// ErrOriginalGone is the error of a dead letter whose body was omitted and
// whose original job is no longer in TOOLQ_JOBS (it aged out, or was
// deleted, or the stream was made again): nothing is left to requeue.
var ErrOriginalGone = errors.New("operate: the original job is no longer in " + jobs.JobsStream)

// ErrRequeueDuplicate: TOOLQ_JOBS dropped a requeue's publish as a
// duplicate of a message with its id; the dead letter was left in the DLQ.
var ErrRequeueDuplicate = errors.New("operate: requeue dropped as a duplicate")

// Original returns the job a dead letter was made of, read from TOOLQ_JOBS
// at d.JobSeq. A dead letter names its original by that sequence alone, and
// a stream made again (or restored) numbers from 1 again: the message there
// is taken for the original only if it is on the dead letter's subject, was
// stored before the dead letter (within a minute, for the servers' clocks),
// in a stream made before it, and agrees with what the dead letter kept of
// it (its headers, its body or the body's size). Errors:
// ErrOriginalGone when that sequence holds no message or another one;
// JetStream's, wrapped.
func Original(ctx context.Context, js jetstream.JetStream, d DeadLetter) (*jetstream.RawStreamMsg, error) {
	if d.JobSeq == 0 {
		return nil, fmt.Errorf("%w: dead letter %d names no job sequence", ErrOriginalGone, d.Seq)
	}
	s, err := streamOf(ctx, js, jobs.JobsStream)
	if err != nil {
		return nil, fmt.Errorf("operate: stream %s: %w", jobs.JobsStream, err)
	}
	m, err := jsretry.Do(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) { return s.GetMsg(ctx, d.JobSeq) })
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("%w (job %d)", ErrOriginalGone, d.JobSeq)
	}
	if err != nil {
		return nil, fmt.Errorf("operate: job %d: %w", d.JobSeq, err)
	}
	if why := notOriginal(d, m, s.CachedInfo().Created); why != "" {
		return nil, fmt.Errorf("%w: job %d is another call: %s", ErrOriginalGone, d.JobSeq, why)
	}
	return m, nil
}

// clockSlack is how far ahead of its dead letter's time an original's may
// be: the two streams' leaders stamp them with their own clocks, which can
// be apart by more than a second (NTP trouble, a VM resumed), and a too
// large job is dead-lettered within milliseconds of being stored. The
// stream's creation gets none: a stream made after the dead letter cannot
// hold its original, and one made again within the minute can hold another
// call of the same subject and size at its sequence, which a dead letter
// that kept neither body nor headers cannot tell. Refusing keeps the dead
// letter; taking the other call would lose it.
const clockSlack = time.Minute

// notOriginal says why m, read from a stream made at created, cannot be the
// job d was made of, or "".
func notOriginal(d DeadLetter, m *jetstream.RawStreamMsg, created time.Time) string {
	switch {
	case created.After(d.Time):
		return fmt.Sprintf("%s was made at %s, after dead letter %d", jobs.JobsStream, created.UTC().Format(time.RFC3339), d.Seq)
	case m.Subject != d.Subject:
		return fmt.Sprintf("it is on %s, the dead letter's was on %s", m.Subject, d.Subject)
	case m.Time.After(d.Time.Add(clockSlack)):
		return fmt.Sprintf("it was stored at %s, after the dead letter", m.Time.UTC().Format(time.RFC3339Nano))
	case d.BodyOmitted == 0 && d.Body != string(m.Data):
		return "its body is not the dead letter's"
	case d.BodyOmitted > 1 && d.BodyOmitted != len(m.Data):
		// 1 stands for a size the dead letter did not say (deadLetterOf).
		return fmt.Sprintf("its body is %d bytes, the dead letter's original was %d", len(m.Data), d.BodyOmitted)
	}
	// The dead letter kept the original's headers but JetStream's own (its
	// Nats-Msg-Id is the dead letter's), as nats.go wrote them: a value
	// trimmed of the spaces around it, which another client may have sent
	// and nats.go keeps when it reads the original.
	for k, v := range d.Header {
		if !strings.HasPrefix(k, "Nats-") && !slices.EqualFunc(m.Header[k], v, sameTrimmed) {
			return fmt.Sprintf("its header %s is not the dead letter's", k)
		}
	}
	return ""
}

// sameTrimmed reports whether a and b are the same header value once
// trimmed as nats.go trims a value it writes.
func sameTrimmed(a, b string) bool {
	return textproto.TrimString(a) == textproto.TrimString(b)
}

// Requeue publishes the dead letter at seq again on its original subject,
// with its original headers and Toolq-Replay-Of: dlq:<seq>, then deletes it
// from the DLQ. A dead letter whose body was omitted is requeued from its
// original in TOOLQ_JOBS, body and headers, and so is one whose headers were
// omitted, or, once that original is gone, from the dead letter with the
// headers it kept. The consumer processes it as any
// delivery: the ledger keeps it from running twice. It returns the new job's
// sequence in TOOLQ_JOBS.
// Errors: those of GetDeadLetter, a dead letter whose original subject is not
// under toolq.jobs., ErrOriginalGone (for an omitted body), the publish
// error; when the job was published but the dead letter could not be
// deleted, the new sequence comes back with the error; ErrRowMayBePurged
// with PurgedBefore; ErrRequeueDuplicate when TOOLQ_JOBS dropped the
// publish as a duplicate. A dead letter that was not requeued stays in the DLQ.
func Requeue(ctx context.Context, js jetstream.JetStream, seq uint64, opts ...RequeueOption) (uint64, error) {
	var o requeueOptions
	for _, opt := range opts {
		opt(&o)
	}
	d, err := GetDeadLetter(ctx, js, seq)
	if err != nil {
		return 0, err
	}
	if d.Time.Before(o.purgedBefore) {
		return 0, fmt.Errorf("%w: dead letter %d is from %s, before the ledger's purge cutoff %s: if its call completed since, requeued it would run again",
			ErrRowMayBePurged, seq, d.Time.UTC().Format(time.RFC3339), o.purgedBefore.UTC().Format(time.RFC3339))
	}
	if !strings.HasPrefix(d.Subject, jobs.JobsPrefix) {
		return 0, fmt.Errorf("operate: dead letter %d has no original subject under %s", seq, jobs.JobsPrefix)
	}
	header, body := d.Header, []byte(d.Body)
	if d.BodyOmitted > 0 || d.HeadersOmitted != "" {
		m, err := Original(ctx, js, d)
		switch {
		case err == nil:
			header, body = m.Header, m.Data
		case d.BodyOmitted > 0:
			return 0, fmt.Errorf("%w: dead letter %d cannot be requeued, its body (%d bytes) was omitted from the DLQ", err, seq, d.BodyOmitted)
		case !errors.Is(err, ErrOriginalGone):
			return 0, err
		}
	}
	msg := nats.NewMsg(d.Subject)
	msg.Data = body
	for k, v := range header {
		if !strings.HasPrefix(k, "Nats-") {
			msg.Header[k] = v
		}
	}
	msg.Header.Set(jobs.HeaderReplayOf, fmt.Sprintf("dlq:%d", seq))
	// The id dedupes two requeues of this dead letter (two operators at
	// once). Its time, in nanoseconds, is the server's: tenants share
	// TOOLQ_JOBS's duplicate window, and an id they could guess
	// (requeue:dlq:<seq>) they could take first.
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("requeue:dlq:%d:%d", seq, d.Time.UnixNano())), jetstream.WithExpectStream(jobs.JobsStream))
	if err != nil {
		return 0, fmt.Errorf("operate: requeue dead letter %d: %w", seq, err)
	}
	if ack.Duplicate {
		return 0, fmt.Errorf("%w: dead letter %d: TOOLQ_JOBS took its requeue as a duplicate (requeued by another at the same time?); it stays in the DLQ", ErrRequeueDuplicate, seq)
	}
	s, err := streamOf(ctx, js, jobs.DLQStream)
	if err == nil {
		err = s.DeleteMsg(ctx, seq)
	}
	if err != nil {
		return ack.Sequence, fmt.Errorf("operate: dead letter %d requeued as job %d but not removed from the DLQ: %w", seq, ack.Sequence, err)
	}
	return ack.Sequence, nil
}

// DeadLetterCount is what CountDeadLetters found: N dead letters of Reason
// (every reason, when empty), the last of them at or before sequence Through
// of TOOLQ_DLQ. PurgeDeadLetters deletes those and no later one.
type DeadLetterCount struct {
	Reason  string `json:"reason,omitempty"`
	N       uint64 `json:"n"`
	Through uint64 `json:"through"` // the stream's last sequence when counted; 0: it was empty
}

// CountDeadLetters counts the dead letters (of one reason, when reason is not
// empty) and notes the last sequence the count covers, for PurgeDeadLetters.
// Errors are JetStream's, wrapped.
func CountDeadLetters(ctx context.Context, js jetstream.JetStream, reason string) (DeadLetterCount, error) {
	s, err := streamOf(ctx, js, jobs.DLQStream)
	if err != nil {
		return DeadLetterCount{}, fmt.Errorf("operate: stream %s: %w", jobs.DLQStream, err)
	}
	c := DeadLetterCount{Reason: reason}
	filter := dlqFilter(reason)
	// The server reads the last sequence and the per-subject totals one after
	// the other: a count is only taken when no dead letter arrived around it.
	for try := 0; ; try++ {
		info, err := jsretry.Do(ctx, func(ctx context.Context) (*jetstream.StreamInfo, error) {
			return s.Info(ctx, jetstream.WithSubjectFilter(filter))
		})
		if err != nil {
			return DeadLetterCount{}, fmt.Errorf("operate: count %s: %w", filter, err)
		}
		var n uint64
		for _, k := range info.State.Subjects {
			n += k
		}
		if try > 0 && info.State.LastSeq == c.Through && n == c.N {
			return c, nil
		}
		if try == 10 {
			return DeadLetterCount{}, fmt.Errorf("operate: count %s: dead letters keep arriving; try again", filter)
		}
		c.N, c.Through = n, info.State.LastSeq
	}
}

// PurgeDeadLetters deletes the dead letters that c counted: those of
// c.Reason up to sequence c.Through. One that arrived after the count stays.
// Errors are JetStream's, wrapped.
func PurgeDeadLetters(ctx context.Context, js jetstream.JetStream, c DeadLetterCount) error {
	if c.N == 0 || c.Through == 0 {
		return nil
	}
	s, err := streamOf(ctx, js, jobs.DLQStream)
	if err != nil {
		return fmt.Errorf("operate: stream %s: %w", jobs.DLQStream, err)
	}
	filter := dlqFilter(c.Reason)
	// The purge sequence is the first one kept.
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(filter), jetstream.WithPurgeSequence(c.Through+1)); err != nil {
		return fmt.Errorf("operate: purge %s through %d: %w", filter, c.Through, err)
	}
	return nil
}

func dlqFilter(reason string) string {
	if reason == "" {
		return jobs.DLQSubjects
	}
	return jobs.DLQSubject(reason)
}

// ReplayRange selects the jobs to replay: a subject (wildcards allowed,
// within toolq.jobs.>) and either a time range or a sequence range.
type ReplayRange struct {
	Subject        string
	Since, Until   time.Time // Until zero: up to now
	FromSeq, ToSeq uint64    // ToSeq zero: up to the last message
}

// Validate returns an error unless r names a subject within toolq.jobs.>
// and exactly one of a time range and a sequence range, whose end is not
// before its start.
func (r ReplayRange) Validate() error {
	if r.Subject == "" || !strings.HasPrefix(r.Subject, jobs.JobsPrefix) {
		return fmt.Errorf("operate: replay subject %q: want one under %s", r.Subject, jobs.JobsPrefix)
	}
	bySeq := r.FromSeq > 0 || r.ToSeq > 0
	switch {
	case bySeq == !r.Since.IsZero():
		return errors.New("operate: replay needs either a time range (since) or a sequence range (from)")
	case bySeq && r.FromSeq == 0:
		return errors.New("operate: replay: the sequence range needs a start")
	case bySeq && r.ToSeq > 0 && r.ToSeq < r.FromSeq:
		return fmt.Errorf("operate: replay: to-seq %d is before from-seq %d", r.ToSeq, r.FromSeq)
	case !bySeq && !r.Until.IsZero() && r.Until.Before(r.Since):
		return fmt.Errorf("operate: replay: until %s is before since %s", r.Until.UTC().Format(time.RFC3339), r.Since.UTC().Format(time.RFC3339))
	}
	return nil
}

// Replayed describes one job a replay published (or, dry, would publish),
// and, when the replay was given the ledger, what the ledger knew of its key
// before and so what its replay does.
type Replayed struct {
	Seq       uint64  `json:"seq"`               // the original's sequence
	NewSeq    uint64  `json:"new_seq,omitempty"` // the replay's sequence
	Subject   string  `json:"subject"`
	Key       string  `json:"key,omitempty"`
	ToolUseID string  `json:"tool_use_id,omitempty"`
	Ledger    string  `json:"ledger,omitempty"` // the row's state, "none", or "" when not consulted
	Outcome   Outcome `json:"outcome"`
}

// Outcome is what the consumer does with a replayed job, as the ledger
// tells before the replay.
type Outcome string

// The outcomes of a replayed job.
const (
	Answered     Outcome = "answered from the ledger" // completed or failed: no effect, the recorded result again
	RunsNow      Outcome = "runs now"                 // no row: the call never settled (or the tool keeps none)
	Waits        Outcome = "waits"                    // in flight: it waits for that attempt (or takes over an expired lease)
	NeedOperator Outcome = "needs an operator"        // indeterminate: 'consumer ledger resolve' first
	Invalid      Outcome = "dead-lettered"            // the body is not a valid job
	Unknown      Outcome = "unknown: ledger not consulted"
)

// RowReader is the ledger as a replay reads it: *ledger.Store.
type RowReader interface {
	Get(ctx context.Context, key string) (ledger.Row, error)
}

// ReplayOption is a knob of one Replay call.
type ReplayOption func(*replayOptions)

type replayOptions struct {
	rows     RowReader
	progress func(done, total uint64)
}

// WithLedger makes Replay look up each job's key in the ledger and set
// Replayed.Ledger and Outcome. A lookup that fails otherwise than with
// ledger.ErrNotFound stops the replay with that error.
func WithLedger(rows RowReader) ReplayOption {
	return func(o *replayOptions) { o.rows = rows }
}

// WithProgress makes Replay call f after each message it read, with how
// many it read and how many there are to read.
func WithProgress(f func(done, total uint64)) ReplayOption {
	return func(o *replayOptions) { o.progress = f }
}

// Summary counts replayed jobs by outcome.
func Summary(reps []Replayed) map[Outcome]int {
	out := map[Outcome]int{}
	for _, r := range reps {
		out[r.Outcome]++
	}
	return out
}

// outcomeOf says what the consumer will do with the job of body, from the
// ledger's row of its key.
func outcomeOf(ctx context.Context, rows RowReader, body []byte) (key, state string, o Outcome, err error) {
	call, err := jobs.DecodeCall(body)
	if err != nil {
		return "", "invalid", Invalid, nil
	}
	if key, err = call.Key(); err != nil {
		return "", "invalid", Invalid, nil
	}
	if rows == nil {
		return key, "", Unknown, nil
	}
	row, err := rows.Get(ctx, key)
	if errors.Is(err, ledger.ErrNotFound) {
		// As the worker does: a row under the key the call had before the
		// member-order fix answers it.
		if lkey, ok := legacyKey(call); ok {
			if lrow, lerr := rows.Get(ctx, lkey); !errors.Is(lerr, ledger.ErrNotFound) {
				key, row, err = lkey, lrow, lerr
			}
		}
	}
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return key, "none", RunsNow, nil
	case err != nil:
		return key, "", "", fmt.Errorf("operate: replay: look up %s: %w", key, err)
	}
	switch row.State {
	case ledger.Completed, ledger.Failed:
		o = Answered
	case ledger.InFlight:
		o = Waits
	default:
		o = NeedOperator
	}
	return key, string(row.State), o, nil
}

// legacyKey is the key the call had before member names were ordered by all
// their UTF-16 code units, when it differs (jobs.Material.Legacy).
func legacyKey(call jobs.Call) (string, bool) {
	m, err := call.Material()
	if err != nil {
		return "", false
	}
	legacy, ok := m.Legacy()
	return legacy.Key(), ok
}

// Replay re-publishes history from TOOLQ_JOBS through the normal path, with
// Toolq-Replay-Of: <original sequence>. Completed calls are answered from the
// ledger, so a replay runs only what never settled. With dry set nothing is
// published. WithLedger says, for each job, what the ledger knew of it just
// before it was (or would be) published. Replays of replays are skipped, so a range can be replayed
// again without growing; a requeued dead letter is replayed unless a job of
// its call came before it in the range. A time range starts where the server finds since
// and reads on to the last job there was when the replay began, keeping the
// jobs stamped within the range. A subject outside toolq.jobs.> or a range
// that Validate refuses is an error before anything is read; a failed
// publish stops the replay and comes back with what was done.
func Replay(ctx context.Context, js jetstream.JetStream, r ReplayRange, dry bool, opts ...ReplayOption) ([]Replayed, error) {
	var o replayOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	bySeq := r.FromSeq > 0 || r.ToSeq > 0
	if bySeq {
		s, err := streamOf(ctx, js, jobs.JobsStream)
		if err != nil {
			return nil, fmt.Errorf("operate: stream %s: %w", jobs.JobsStream, err)
		}
		if last := s.CachedInfo().State.LastSeq; r.FromSeq > last {
			return nil, fmt.Errorf("operate: replay: from-seq %d is after the last sequence of %s, %d", r.FromSeq, jobs.JobsStream, last)
		}
	}
	cfg := jetstream.ConsumerConfig{}
	if bySeq {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, r.FromSeq
	} else {
		since := r.Since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	stamp := time.Now().UnixNano()
	var out []Replayed
	runs := map[string]bool{}      // keys of jobs in this replay that run now
	published := map[string]bool{} // keys of the jobs this replay publishes
	err := scanStream(ctx, js, jobs.JobsStream, r.Subject, cfg, o.progress, func(m jetstream.Msg) (bool, error) {
		meta, err := m.Metadata()
		if err != nil {
			return false, err
		}
		seq := meta.Sequence.Stream
		if r.ToSeq > 0 && seq > r.ToSeq {
			return false, nil
		}
		// A time range is read to the end and each job kept by its own
		// time: a server's clock that stepped back stamps a later job
		// earlier, so a job after until does not mean none in the range
		// follows. The start the server found can be before since (a
		// consumer on a server still catching up searches what it has).
		// A replay is of a job in TOOLQ_JOBS (Toolq-Replay-Of: <seq>); a
		// requeued dead letter (dlq:<seq>) is not, and can be its call's
		// only job left once the original aged out.
		replayOf := m.Headers().Get(jobs.HeaderReplayOf)
		requeued := strings.HasPrefix(replayOf, "dlq:")
		if (replayOf != "" && !requeued) || meta.Timestamp.Before(r.Since) ||
			(!r.Until.IsZero() && meta.Timestamp.After(r.Until)) {
			return true, nil
		}
		rep := Replayed{Seq: seq, Subject: m.Subject(), Key: m.Headers().Get(jobs.HeaderKey), ToolUseID: toolUseIDOf(m.Data())}
		key, state, outcome, err := outcomeOf(ctx, o.rows, m.Data())
		if err != nil {
			return false, err
		}
		if key != "" {
			rep.Key = key
		}
		if requeued && key != "" && published[key] {
			return true, nil // its call's original (or another job of it) is in this replay
		}
		published[key] = true
		if outcome == RunsNow && runs[key] {
			outcome = Answered // by the row an earlier job of this replay settles
		}
		runs[key] = runs[key] || outcome == RunsNow
		rep.Ledger, rep.Outcome = state, outcome
		if !dry {
			msg := nats.NewMsg(m.Subject())
			msg.Data = m.Data()
			for k, v := range m.Headers() {
				if !strings.HasPrefix(k, "Nats-") {
					msg.Header[k] = v
				}
			}
			msg.Header.Set(jobs.HeaderReplayOf, strconv.FormatUint(seq, 10))
			// Asked again when unanswered: its id makes a second publish a
			// duplicate JetStream drops, and answers with the first's sequence.
			ack, err := jsretry.Publish(ctx, js, jobs.JobsStream, func(ctx context.Context) (*jetstream.PubAck, error) {
				return js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("replay:%d:%d", seq, stamp)), jetstream.WithExpectStream(jobs.JobsStream))
			})
			if err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, nats.ErrTimeout)) {
				// Unanswered: the server may have stored it.
				return false, fmt.Errorf("operate: replay of %d: it may have been published (no answer came): %w", seq, err)
			}
			if err != nil {
				return false, fmt.Errorf("operate: replay of %d: %w", seq, err)
			}
			rep.NewSeq = ack.Sequence
		}
		out = append(out, rep)
		return true, nil
	})
	return out, err
}

// streamOf is js.Stream(ctx, name), asked again when unanswered: a
// stream's info is a read.
func streamOf(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	return jsretry.Do(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, name) })
}
