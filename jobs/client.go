package jobs

import (
	"context"
	"encoding/json"
	"errors"

	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/internal/jcs"
	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/internal/pull"
)

// Client is the agent's side of toolq: it publishes jobs and awaits their
// results.
type Client struct {
	js         jetstream.JetStream
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	tenant     string
}

// ClientOption adjusts a Client.
type ClientOption func(*Client)

// WithTracerProvider sets where the client's send spans go (default: the
// global provider).
func WithTracerProvider(tp trace.TracerProvider) ClientOption {
	return func(c *Client) { c.tracer = tp.Tracer(tracerName) }
}

// WithPropagator sets how trace context is written into job headers
// (default: the global propagator).
func WithPropagator(p propagation.TextMapPropagator) ClientOption {
	return func(c *Client) { c.propagator = p }
}

// WithTenant makes the client a tenant's (docs/tenants.md): its jobs carry
// the tenant (a job's own tenant, if set, must be this one) and are
// published on toolq.<tenant>.jobs.<tool>, its results are awaited on
// toolq.<tenant>.results.<conversation_id> in the tenant's results stream,
// and its lookups asked on toolq.<tenant>.ledger.get. The default, "", is
// the default tenant: today's subjects, streams and keys.
func WithTenant(tenant string) ClientOption {
	return func(c *Client) { c.tenant = tenant }
}

const tracerName = "github.com/toolq/toolq/jobs"

// NewClient returns a client on a JetStream context. The streams must exist
// (the consumer provisions them at start, or call ProvisionStreams).
func NewClient(js jetstream.JetStream, opts ...ClientOption) *Client {
	c := &Client{js: js, tracer: otel.GetTracerProvider().Tracer(tracerName), propagator: otel.GetTextMapPropagator()}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Published is the answer to Publish.
type Published struct {
	Key      string `json:"key"`
	Stream   string `json:"stream"`
	Sequence uint64 `json:"seq"`
	// Duplicate is true when JetStream dropped the message as an exact
	// re-publication (same key and tool_use_id) inside its duplicate window.
	// It can also be true for a job's first publication: when the answer to
	// the first request was lost, the publish is asked again under the same
	// message id, and JetStream answers the second as a duplicate of the
	// first (Sequence is the first's). Either way the job is in the stream
	// once; RunTurn and PublishAndAwait then read results from the start.
	Duplicate bool `json:"duplicate"`
}

// Publish validates the job, derives its key and publishes it on
// toolq.jobs.<tool> with the headers of the contract: Toolq-Key, a
// Nats-Msg-Id of job:<key>:<tool_use_id>, and the W3C trace context of a
// send span, a child of ctx's span (see WithTracerProvider). A zero CreatedAt is set to
// now. Errors: a *FieldError for an invalid job, or the publish error.
func (c *Client) Publish(ctx context.Context, j *Job) (Published, error) {
	if j.Version == 0 {
		j.Version = Version
	}
	if j.CreatedAt.IsZero() {
		j.CreatedAt = time.Now().UTC()
	}
	if j.Tenant == "" {
		j.Tenant = c.tenant
	}
	if j.Tenant != c.tenant {
		return Published{}, &FieldError{Field: "tenant", Rule: fmt.Sprintf("must be the client's tenant %q, got %q", c.tenant, j.Tenant)}
	}
	if err := j.Validate(); err != nil {
		return Published{}, err
	}
	key, err := j.Key()
	if err != nil {
		return Published{}, err
	}
	body, err := json.Marshal(j)
	if err != nil {
		return Published{}, err
	}
	subject, msgID := TenantJobSubject(j.Tenant, j.Tool), JobMsgID(key, j.ToolUseID)
	ctx, span := c.tracer.Start(ctx, "send "+subject, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		attribute.String("messaging.system", "nats"), attribute.String("messaging.destination.name", subject),
		attribute.String("messaging.message.id", msgID), attribute.String("messaging.operation.type", "send"),
		attribute.String("toolq.key", key), attribute.String("toolq.tool", j.Tool), attribute.String("toolq.tool_use_id", j.ToolUseID),
		attribute.String("toolq.conversation_id", j.ConversationID)))
	defer span.End()
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set(HeaderKey, key)
	c.propagator.Inject(ctx, HeaderCarrier(msg.Header))
	// Asked again when unanswered: the message id makes a second publish
	// of the job a duplicate JetStream drops.
	ack, err := jsretry.Publish(ctx, c.js, JobsStream, func(ctx context.Context) (*jetstream.PubAck, error) {
		return c.js.PublishMsg(ctx, msg, jetstream.WithMsgID(msgID), jetstream.WithExpectStream(JobsStream))
	})
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "publish failed")
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			return Published{Key: key}, fmt.Errorf("jobs: publish %s: no stream takes %s (%w): the streams are created by the first consumer that starts: start one (`consumer`) against this NATS server, or check the NATS URL", j.ToolUseID, msg.Subject, err)
		}
		return Published{Key: key}, fmt.Errorf("jobs: publish %s: %w", j.ToolUseID, err)
	}
	return Published{Key: key, Stream: ack.Stream, Sequence: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// AwaitOption adjusts a wait for results: Await, AwaitAll,
// PublishAndAwait, RunTurn, Awaiting.Wait and Turn.Commit.
type AwaitOption func(*awaitConfig)

type awaitConfig struct{ final bool }

// UntilFinal waits for each call's final result (Status.Final): past a
// result awaiting a person's approval, which may take hours, to the one
// that follows its decision. Without it a wait returns as soon as each
// call has a result, one awaiting approval included, so that an agent is
// never held up by a person; the final result can be awaited later, or
// the call looked up by its key (Client.Lookup).
func UntilFinal() AwaitOption { return func(c *awaitConfig) { c.final = true } }

func awaitConfigOf(opts []AwaitOption) awaitConfig {
	var c awaitConfig
	for _, o := range opts {
		o(&c)
	}
	return c
}

// enough reports whether r ends a wait of this config.
func (c awaitConfig) enough(r *Result) bool { return r != nil && (!c.final || r.Status.Final()) }

// Supersedes reports whether r, read after prev (nil: none) for the same
// tool_use_id, answers the call instead of prev: a later answer supersedes
// an earlier one (the run after an operator resolved an indeterminate call
// as not run, the final result after one awaiting approval), except that a
// result awaiting approval never supersedes a final one (a pending answer
// that a decision overtook).
func (r *Result) Supersedes(prev *Result) bool {
	return prev == nil || r.Status.Final() || !prev.Status.Final()
}

// Await waits for the result addressed to toolUseID in the conversation,
// including one published before Await was called (it reads the
// conversation's results from the start; PublishAndAwait reads only what
// comes after the job): the latest that came, a final one over one
// awaiting approval. A call awaiting approval is returned as such
// (StatusAwaitingApproval) unless UntilFinal is given. It returns ctx's
// error when ctx ends first. Each call reads through an ordered consumer of
// its own; an agent that awaits many results at once reads them through one
// Results instead.
func (c *Client) Await(ctx context.Context, conversationID, toolUseID string, opts ...AwaitOption) (*Result, error) {
	got, err := c.awaitAll(ctx, conversationID, []string{toolUseID}, 0, awaitConfigOf(opts))
	if err != nil {
		return nil, err
	}
	return got[toolUseID], nil
}

// PublishAndAwait publishes the job and waits for its result. It reads only
// the results published after the job, so a long conversation costs nothing
// extra; when JetStream drops the job as an exact re-publication (the same
// key and tool_use_id, already published), its result may be older than
// that, and it reads the conversation from the start. As with Await, a call
// awaiting approval is returned as such unless UntilFinal is given.
func (c *Client) PublishAndAwait(ctx context.Context, j *Job, opts ...AwaitOption) (*Result, error) {
	from, err := c.resultsCursor(ctx)
	if err != nil {
		return nil, err
	}
	pub, err := c.Publish(ctx, j)
	if err != nil {
		return nil, err
	}
	if pub.Duplicate {
		from = 0
	}
	got, err := c.awaitAll(ctx, j.ConversationID, []string{j.ToolUseID}, from, awaitConfigOf(opts))
	if err != nil {
		return nil, err
	}
	return got[j.ToolUseID], nil
}

// resultsCursor is the sequence the next result will get: every result of a
// job published after this call comes at or after it.
func (c *Client) resultsCursor(ctx context.Context) (uint64, error) {
	name := TenantStream(c.tenant, ResultsStream)
	s, err := jsretry.Do(ctx, func(ctx context.Context) (jetstream.Stream, error) { return c.js.Stream(ctx, name) })
	if err != nil {
		return 0, fmt.Errorf("jobs: stream %s: %w", name, err)
	}
	return s.CachedInfo().State.LastSeq + 1, nil // the info js.Stream just asked for
}

// AwaitAll waits for the results addressed to the given tool_use_ids in
// the conversation, ones published before the call included, reading the
// conversation once; the latest answer to each when there are several (a
// final one over one awaiting approval). A call awaiting approval is
// returned as such unless UntilFinal is given. On ctx's end it returns what
// it has with ctx's error.
func (c *Client) AwaitAll(ctx context.Context, conversationID string, toolUseIDs []string, opts ...AwaitOption) (map[string]*Result, error) {
	return c.awaitAll(ctx, conversationID, toolUseIDs, 0, awaitConfigOf(opts))
}

// awaitAll reads the conversation's results, from sequence from (0: the
// first), until it has one for each of the given tool_use_ids (a final one
// with UntilFinal) and has read every result published before it started;
// results for other ids (an abandoned attempt of the turn, another turn)
// are skipped. A later answer to a tool_use_id supersedes an earlier one
// (Result.Supersedes): the call run after an operator resolved it as not run, say,
// answers after its indeterminate.
func (c *Client) awaitAll(ctx context.Context, conversationID string, toolUseIDs []string, from uint64, wait awaitConfig) (map[string]*Result, error) {
	want := make(map[string]bool, len(toolUseIDs))
	for _, id := range toolUseIDs {
		want[id] = true
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{TenantResultSubject(c.tenant, conversationID)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := pull.OrderedConsumer(ctx, c.js, TenantStream(c.tenant, ResultsStream), cfg)
	if err != nil {
		return nil, fmt.Errorf("jobs: await results of %s: %w", conversationID, err)
	}
	iter, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("jobs: await results of %s: %w", conversationID, err)
	}
	it := pull.New(iter, c.js.Conn())
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	got := make(map[string]*Result, len(want))
	enough := 0       // ids whose result ends the wait
	caughtUp := false // read every result the stream held when it was last asked
	for enough < len(want) || !caughtUp {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return got, ctx.Err()
			}
			return got, fmt.Errorf("jobs: await results of %s: %w", conversationID, err)
		}
		meta, err := msg.Metadata()
		caughtUp = err != nil || meta.NumPending == 0
		r, err := DecodeResult(msg.Data())
		if err != nil || r.Tenant != c.tenant || !want[r.ToolUseID] || !r.Supersedes(got[r.ToolUseID]) {
			continue // another tenant's result is never this client's (docs/tenants.md)
		}
		if !wait.enough(got[r.ToolUseID]) && wait.enough(r) {
			enough++
		}
		got[r.ToolUseID] = r
	}
	return got, nil
}

// ToolCall is one tool_use block of a completed assistant turn.
type ToolCall struct {
	ToolUseID string          `json:"tool_use_id"`
	Tool      string          `json:"name"`
	Args      json.RawMessage `json:"input"`
}

// ToolResult is the tool_result entry to append to the turn for one call.
type ToolResult struct {
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error,omitempty"`
	Result    *Result         `json:"-"`
}

// RunTurn publishes the tool calls of one completed assistant turn and
// gathers their results, returned in the order of the calls as the
// tool_result entries to append to that turn. Identical calls (same tool and
// canonical args) get ordinals 0, 1, … in order of appearance. Results
// addressed to tool_use_ids that are not in this turn (those of an abandoned
// attempt) are ignored. Like PublishAndAwait it reads only the results
// published after the jobs, unless JetStream dropped one as an exact
// re-publication (the turn run again with the same tool_use_ids): then it
// reads the conversation from the start. A call awaiting approval is
// answered with its pending result (a tool_result saying so, see
// Result.ToolResult) unless UntilFinal is given. On ctx's end it returns
// what it has with ctx's error.
func (c *Client) RunTurn(ctx context.Context, conversationID string, turnIndex int64, calls []ToolCall, opts ...AwaitOption) ([]ToolResult, error) {
	from, err := c.resultsCursor(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]int64{}
	ids := make([]string, len(calls))
	for i, call := range calls {
		canon, err := jcs.CanonicalizeObject(call.Args)
		if err != nil {
			return nil, &FieldError{Field: "args", Rule: "of " + call.ToolUseID + " must be a canonicalizable JSON object", Err: err}
		}
		identity := call.Tool + "|" + string(canon)
		j := &Job{ConversationID: conversationID, TurnIndex: turnIndex, Ordinal: seen[identity], Tool: call.Tool,
			ToolUseID: call.ToolUseID, Args: call.Args}
		seen[identity]++
		pub, err := c.Publish(ctx, j)
		if err != nil {
			return nil, err
		}
		if pub.Duplicate {
			from = 0 // its result may be older than the cursor
		}
		ids[i] = call.ToolUseID
	}
	got, err := c.awaitAll(ctx, conversationID, ids, from, awaitConfigOf(opts))
	out := make([]ToolResult, 0, len(calls))
	for _, id := range ids {
		if r, ok := got[id]; ok {
			out = append(out, r.ToolResult())
		}
	}
	return out, err
}

// ToolResult turns a result into the tool_result entry for the model: the
// output for ok; for a call awaiting approval, not an error but a JSON
// string that says so (ApprovalText); else an error object the model can
// read, {"status": …, "error": {"code": …, "message": …}}, whose message
// for a denied or expired call is its ApprovalText.
func (r *Result) ToolResult() ToolResult {
	tr := ToolResult{ToolUseID: r.ToolUseID, Result: r, Content: r.Output}
	switch r.Status {
	case StatusOK:
	case StatusAwaitingApproval:
		tr.Content, _ = json.Marshal(r.ApprovalText())
	default:
		tr.IsError = true
		e := ResultError{Code: string(r.Status)}
		if r.Error != nil {
			e = *r.Error
		}
		if text := r.ApprovalText(); text != "" {
			e.Message = text
		}
		tr.Content, _ = json.Marshal(map[string]any{"status": r.Status, "error": e})
	}
	if tr.Content == nil {
		tr.Content = json.RawMessage("null")
	}
	return tr
}

// ApprovalText is what the model reads of a call that a person had to
// approve and that has not run: for one awaiting approval "awaiting
// approval by a person (key …, expires …); the call has not run", for a
// denied one "denied by NAME: REASON; the call did not run", for an
// expired one that no person decided in time. It is "" for the other
// statuses.
func (r *Result) ApprovalText() string {
	a := r.Approval
	if a == nil {
		a = &ResultApproval{}
	}
	switch r.Status {
	case StatusAwaitingApproval:
		if a.ExpiresAt.IsZero() {
			return fmt.Sprintf("awaiting approval by a person (key %s); the call has not run", r.Key)
		}
		return fmt.Sprintf("awaiting approval by a person (key %s, expires %s); the call has not run", r.Key, a.ExpiresAt.UTC().Format(time.RFC3339))
	case StatusDenied:
		text := "denied by a person"
		if a.DecidedBy != "" {
			text = "denied by " + a.DecidedBy
		}
		if a.Reason != "" {
			text += ": " + a.Reason
		}
		return text + "; the call did not run"
	case StatusExpired:
		if a.ExpiresAt.IsZero() {
			return "expired: no person decided in time; the call did not run"
		}
		return fmt.Sprintf("expired: no person decided before %s; the call did not run", a.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return ""
}

// HeaderCarrier adapts NATS headers to OpenTelemetry's TextMapCarrier.
type HeaderCarrier nats.Header

var _ propagation.TextMapCarrier = HeaderCarrier{}

// Get returns the first value of key.
func (h HeaderCarrier) Get(key string) string { return nats.Header(h).Get(key) }

// Set sets key to value.
func (h HeaderCarrier) Set(key, value string) { nats.Header(h).Set(key, value) }

// Keys lists the header names.
func (h HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}
