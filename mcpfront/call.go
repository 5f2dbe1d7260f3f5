package mcpfront

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/jcs"
	"github.com/toolq/toolq/internal/pull"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
)

// call serves one tools/call of tool t:
//
//   - a _meta that names the call wrongly (a bad field, one of the two
//     without the other) is refused, as is a write that it does not name;
//   - a read it does not name runs here, at once;
//   - args the tool's schema refuses are a rejected result (nothing ran);
//   - otherwise the call is a job, published (a re-issue is the same job)
//     and answered with its result, or with CodeNoResultYet when the result
//     does not come within the wait. A call that awaits a person's approval
//     is answered at once with its pending result (not an error); the same
//     call sent again is answered with the latest result, the final one
//     once the call was decided.
func (s *Server) call(ctx context.Context, t *tools.Tool, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	args := json.RawMessage(req.Params.Arguments)
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	id, named, err := identify(req.Params.Meta)
	switch {
	case err != nil:
		return nil, invalidParams(err.Error())
	case !named && t.Class == tools.Read:
		return s.runRead(ctx, t, args), nil
	case !named:
		return nil, invalidParams(unnamedWrite(t))
	}
	if err := t.Validate(args); err != nil {
		return rejected(err), nil
	}
	j := &jobs.Job{ConversationID: id.conversationID, TurnIndex: id.turnIndex, Ordinal: id.ordinal, Tool: t.Name, Args: args}
	key, err := j.Key()
	if err != nil {
		var fe *jobs.FieldError
		if errors.As(err, &fe) && fe.Field == "conversation_id" {
			return nil, invalidParams(fmt.Sprintf("toolq: _meta %q: %s", MetaConversationID, fe.Rule))
		}
		return rejected(err), nil
	}
	// The tool_use_id follows from the key, so that a re-issue is the same
	// job (JetStream drops the re-publication) and the same call.
	j.ToolUseID = "mcp_" + key
	// Measured as published: Publish keeps the version and created_at set
	// here, so the body sized is the body sent.
	j.Version, j.CreatedAt = jobs.Version, time.Now().UTC()
	body, err := json.Marshal(j)
	if err != nil {
		return rejected(err), nil
	}
	if s.cfg.MaxBodySize > 0 && len(body) > s.cfg.MaxBodySize {
		return tooLarge(key, fmt.Sprintf("the job is %d bytes, over the consumer's limit of %d (--max-body-size)", len(body), s.cfg.MaxBodySize)), nil
	}
	if limit := s.cfg.JS.Conn().MaxPayload(); int64(len(body)) > limit {
		return tooLarge(key, fmt.Sprintf("the job is %d bytes, over the NATS server's max_payload of %d", len(body), limit)), nil
	}
	res, err := s.await(ctx, j, key)
	var notRun *notRunError
	switch {
	case errors.Is(err, nats.ErrMaxPayload): // the headers took it over
		return tooLarge(key, fmt.Sprintf("the job (%d bytes and its headers) is over the NATS server's max_payload of %d", len(body), s.cfg.JS.Conn().MaxPayload())), nil
	case errors.As(err, &notRun):
		return nil, &jsonrpc.Error{Code: CodeNoResultYet, Message: notRun.Error()}
	case err != nil:
		return nil, s.noResult(key, err)
	}
	return resultOf(res), nil
}

// identity is what a tools/call's _meta says of the call: the fields of
// its key that neither the tool nor the arguments give.
type identity struct {
	conversationID string
	turnIndex      int64
	ordinal        int64
}

// identify reads the io.toolq fields of a _meta. named is false when it
// has neither MetaConversationID nor MetaTurnIndex. The error names a field
// that is there but wrong, or the one of the two that is missing.
func identify(meta mcp.Meta) (id identity, named bool, err error) {
	for name := range meta {
		if strings.HasPrefix(strings.ToLower(name), metaPrefix) && name != MetaConversationID && name != MetaTurnIndex && name != MetaOrdinal {
			return id, false, fmt.Errorf("toolq: _meta %q is not a field toolq reads: a call is named by %q, %q and %q (optional)", name, MetaConversationID, MetaTurnIndex, MetaOrdinal)
		}
	}
	conv, hasConv := meta[MetaConversationID]
	turn, hasTurn := meta[MetaTurnIndex]
	ordinal, hasOrdinal := meta[MetaOrdinal]
	switch {
	case !hasConv && !hasTurn && hasOrdinal:
		return id, false, fmt.Errorf("toolq: _meta has %q without %q and %q, which name the call", MetaOrdinal, MetaConversationID, MetaTurnIndex)
	case !hasConv && !hasTurn:
		return id, false, nil
	case !hasConv:
		return id, false, fmt.Errorf("toolq: _meta has %q without %q: send both (the conversation and the index of the assistant turn that made the call)", MetaTurnIndex, MetaConversationID)
	case !hasTurn:
		return id, false, fmt.Errorf("toolq: _meta has %q without %q: send both (the conversation and the index of the assistant turn that made the call)", MetaConversationID, MetaTurnIndex)
	}
	var ok bool
	if id.conversationID, ok = conv.(string); !ok {
		return id, false, fmt.Errorf("toolq: _meta %q: must be a string, got %s", MetaConversationID, describe(conv))
	}
	if id.turnIndex, ok = integer(turn); !ok {
		return id, false, fmt.Errorf("toolq: _meta %q: must be an integer from 0 to 2^53−1, got %s", MetaTurnIndex, describe(turn))
	}
	if hasOrdinal {
		if id.ordinal, ok = integer(ordinal); !ok {
			return id, false, fmt.Errorf("toolq: _meta %q: must be an integer from 0 to 2^53−1, got %s", MetaOrdinal, describe(ordinal))
		}
	}
	return id, true, nil
}

// maxInteger is the largest integer a _meta field takes, 2^53−1: a
// double holds every integer up to it, and 2^53 is also what 2^53+1
// decodes to, so taking it would take one turn for the next.
const maxInteger = 1<<53 - 1

// integer reads a non-negative integer of a decoded _meta: a JSON number
// with no fraction, at most maxInteger (above, a double cannot tell
// integers apart, and clients in other languages would derive other keys).
func integer(v any) (int64, bool) {
	switch n := v.(type) {
	case float64:
		if n >= 0 && n <= maxInteger && n == math.Trunc(n) {
			return int64(n), true
		}
	case json.Number:
		i, err := strconv.ParseInt(string(n), 10, 64)
		return i, err == nil && i >= 0 && i <= maxInteger
	case int64:
		return n, n >= 0 && n <= maxInteger
	case int:
		return int64(n), n >= 0 && n <= maxInteger
	}
	return 0, false
}

func describe(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%T", v)
	}
	if len(b) > 40 {
		b = append(b[:40], "…"...)
	}
	return string(b)
}

// unnamedWrite is the refusal of a write called without the fields that
// name it.
func unnamedWrite(t *tools.Tool) string {
	return fmt.Sprintf("toolq: %s is a write tool (%s): its tools/call must carry in _meta %q (the conversation, a string matching ^[A-Za-z0-9_:-]{1,128}$) "+
		"and %q (the index of the assistant turn that made the call, an integer ≥ 0), and may carry %q (0, 1, … among identical calls of one turn; default 0). "+
		"They make the call's key: the same call sent again (after a broken stream) is answered with its first result, and a call in a later turn runs again. "+
		"toolq does not guess the turn: a guess would either swallow a deliberate second call or run a re-issue twice",
		t.Name, t.Class, MetaConversationID, MetaTurnIndex, MetaOrdinal)
}

func invalidParams(msg string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: msg}
}

// noResult is the error of a call whose result did not come: it is queued
// or running, and sending it again is safe.
func (s *Server) noResult(key string, err error) error {
	var why string
	switch {
	case errors.Is(err, errClosed):
		why = "the server stopped waiting (it is shutting down)"
	case errors.Is(err, context.DeadlineExceeded):
		why = fmt.Sprintf("no result within %s", s.cfg.Wait)
	case errors.Is(err, context.Canceled):
		why = "the request was cancelled"
	case errors.Is(err, errRunningAgain):
		why = "an operator resolved its unknown outcome as not run, and it is running again"
	default:
		s.cfg.Logger.Warn("MCP call not queued or not answered", "key", key, "error", err)
		why = err.Error()
	}
	return &jsonrpc.Error{Code: CodeNoResultYet, Message: fmt.Sprintf("toolq: call %s: %s. It may be queued or running: "+
		"send the same tools/call again (same _meta and arguments) to get its result; it will not run twice", key, why)}
}

// runRead runs a read tool that no _meta names, here and at once, as the
// worker runs reads: no key, no ledger.
func (s *Server) runRead(ctx context.Context, t *tools.Tool, args json.RawMessage) *mcp.CallToolResult {
	if err := t.Validate(args); err != nil {
		return rejected(err)
	}
	canonical, err := jcs.CanonicalizeObject(args)
	if err != nil { // Validate passed: cannot happen
		return rejected(err)
	}
	out, err := t.Run(ctx, tools.Request{Tool: t.Name, Args: canonical, ToolUseID: "mcp_read"})
	if err != nil {
		_, te := tools.Classify(err)
		return errorResult(jobs.StatusError, "", &jobs.ResultError{Code: te.Code, Message: te.Message})
	}
	return okResult("", out)
}

// resultOf is the MCP result of a job's result. A call awaiting approval
// is not an error: its text says it waits for a person and has not run
// (jobs.Result.ApprovalText); a denied or expired one is an error whose
// message says who denied it and why, or that nobody decided in time.
// The result of a call that needed approval carries it in MetaApproval.
func resultOf(r *jobs.Result) *mcp.CallToolResult {
	var res *mcp.CallToolResult
	switch r.Status {
	case jobs.StatusOK:
		res = okResult(r.Key, r.Output)
	case jobs.StatusAwaitingApproval:
		res = &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: r.ApprovalText()}}, Meta: meta(r.Status, r.Key)}
	default:
		e := r.Error
		if e == nil {
			e = &jobs.ResultError{Code: string(r.Status)}
		}
		switch {
		case r.Status == jobs.StatusIndeterminate:
			e = &jobs.ResultError{Code: e.Code, Message: fmt.Sprintf("the outcome of this call is unknown (%s): toolq will not run it again by itself. "+
				"An operator decides, with consumer ledger show %s and consumer ledger resolve %s; until then the same call is answered so", e.Message, r.Key, r.Key)}
		case r.ApprovalText() != "":
			e = &jobs.ResultError{Code: e.Code, Message: r.ApprovalText()}
		}
		res = errorResult(r.Status, r.Key, e)
	}
	if r.Approval != nil {
		res.Meta[MetaApproval] = approvalMeta(r.Approval)
	}
	return res
}

// approvalMeta is a call's approval as MetaApproval gives it: without the
// args, which are the call's own.
func approvalMeta(a *jobs.ResultApproval) map[string]any {
	m := map[string]any{"group": a.Group, "args_digest": a.ArgsDigest,
		"requested_at": a.RequestedAt.UTC().Format(time.RFC3339Nano), "expires_at": a.ExpiresAt.UTC().Format(time.RFC3339Nano)}
	if a.Decision != "" {
		m["decision"], m["decided_by"], m["reason"] = a.Decision, a.DecidedBy, a.Reason
	}
	if !a.DecidedAt.IsZero() {
		m["decided_at"] = a.DecidedAt.UTC().Format(time.RFC3339Nano)
	}
	return m
}

func okResult(key string, out json.RawMessage) *mcp.CallToolResult {
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(out)}}, Meta: meta(jobs.StatusOK, key)}
	if strings.HasPrefix(strings.TrimSpace(string(out)), "{") {
		res.StructuredContent = out
	}
	return res
}

// errorResult is a result with isError: its text is the error as the
// other clients give it to the model, {"status": …, "error": {code, message}}.
func errorResult(status jobs.Status, key string, e *jobs.ResultError) *mcp.CallToolResult {
	body, _ := json.Marshal(map[string]any{"status": status, "error": e})
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(body)}}, IsError: true, Meta: meta(status, key)}
}

func rejected(err error) *mcp.CallToolResult {
	code := "invalid_args"
	return errorResult(jobs.StatusRejected, "", &jobs.ResultError{Code: code, Message: err.Error()})
}

// tooLarge is the result of a call whose job cannot be queued: it would be
// dead-lettered, or the broker refuses it. Nothing ran, and the same call
// sent again is refused the same way.
func tooLarge(key, why string) *mcp.CallToolResult {
	return errorResult(jobs.StatusRejected, key, &jobs.ResultError{Code: "too_large", Message: why + ": nothing ran; send smaller arguments"})
}

func meta(status jobs.Status, key string) mcp.Meta {
	m := mcp.Meta{MetaStatus: string(status)}
	if key != "" {
		m[MetaKey] = key
	}
	return m
}

// errClosed ends the calls still waiting when the server closes.
var errClosed = errors.New("mcpfront: server closed")

// errRunningAgain is a call whose indeterminate result an operator
// resolved as not run, and which runs again now.
var errRunningAgain = errors.New("mcpfront: the call runs again")

// flight is one call waiting for its result; a re-issue that comes while
// it waits waits with it.
type flight struct {
	done chan struct{}
	res  *jobs.Result
	err  error
}

// await publishes the job and waits for its result, for at most
// Config.Wait from its first request, and less if ctx ends first. The wait
// does not end with the request that started it: a client whose stream
// was cut sends the call again, and that request waits for the same
// result.
func (s *Server) await(ctx context.Context, j *jobs.Job, key string) (*jobs.Result, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	f, ok := s.flights[key]
	if !ok {
		f = &flight{done: make(chan struct{})}
		s.flights[key] = f
		// The request's values (its span) without its end; the server's end.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Wait)
		stop := context.AfterFunc(s.ctx, cancel)
		go func() {
			defer cancel()
			defer stop()
			f.res, f.err = s.publishAndAwait(fctx, j)
			if f.err == nil && f.res.Status == jobs.StatusIndeterminate {
				f.res, f.err = s.settled(fctx, f.res)
			}
			if f.err != nil && s.ctx.Err() != nil {
				f.err = errClosed
			}
			s.mu.Lock()
			delete(s.flights, key)
			s.mu.Unlock()
			close(f.done)
		}()
	}
	s.mu.Unlock()
	select {
	case <-f.done:
		return f.res, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// publishAndAwait publishes the job and waits for its result: through the
// reader of every conversation's results, expected before the job is
// published; or, when JetStream drops the job as a re-publication (the
// call re-issued within its duplicate window), from the start of the
// conversation, since the result may have come before.
func (s *Server) publishAndAwait(ctx context.Context, j *jobs.Job) (*jobs.Result, error) {
	reader, err := s.results(ctx)
	if err != nil {
		return nil, err
	}
	aw := reader.ExpectIn(j.ConversationID, j.ToolUseID)
	defer aw.Cancel()
	pub, err := s.client.Publish(ctx, j)
	if err != nil {
		return nil, err
	}
	keys := resultKeys(j, pub.Key)
	if !pub.Duplicate {
		got, err := aw.Wait(ctx)
		switch {
		case err == nil && slices.Contains(keys, got[0].Key):
			return got[0], nil
		case err == nil: // another call's result, with this tool_use_id: read on
		case !errors.Is(err, jobs.ErrResultsClosed):
			return nil, err
		default:
			s.cfg.Logger.Warn("MCP front door: the results reader stopped; reading the conversation instead", "error", err)
			s.dropResults(reader)
		}
	}
	return s.awaitKey(ctx, j.ConversationID, j.ToolUseID, keys)
}

// resultKeys are the keys of the results that answer j, whose key is key:
// that key, and the call's legacy key when it has one, since a call made
// before the member-order fix is answered from its ledger row under that
// key, and its result carries it (worker/legacykey.go). No other call has
// either key.
func resultKeys(j *jobs.Job, key string) []string {
	m, err := j.Call().Material()
	if err != nil {
		return []string{key}
	}
	if legacy, ok := m.Legacy(); ok {
		return []string{key, legacy.Key()}
	}
	return []string{key}
}

// awaitKey reads the conversation's results from the start until it has
// read every result published before it started and holds one addressed
// to toolUseID with one of the call's keys (resultKeys): the latest such,
// since an operator's resolution as not run and the run that follows
// answer after an indeterminate, and the final result after one awaiting approval (but
// never a pending one after a final one: a pending answer that a decision
// overtook). A result with another key (a job published with the same
// tool_use_id by someone else) is another call's, and skipped.
func (s *Server) awaitKey(ctx context.Context, conversationID, toolUseID string, keys []string) (*jobs.Result, error) {
	cons, err := pull.OrderedConsumer(ctx, s.cfg.JS, jobs.ResultsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{jobs.ResultSubject(conversationID)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("mcpfront: read the results of %s: %w", conversationID, err)
	}
	iter, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("mcpfront: read the results of %s: %w", conversationID, err)
	}
	it := pull.New(iter, s.cfg.JS.Conn())
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	var got *jobs.Result
	caughtUp := false // read every result the stream held when it was last asked
	for got == nil || !caughtUp {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("mcpfront: read the results of %s: %w", conversationID, err)
		}
		meta, err := msg.Metadata()
		caughtUp = err != nil || meta.NumPending == 0
		r, err := jobs.DecodeResult(msg.Data())
		if err != nil || r.ToolUseID != toolUseID || !slices.Contains(keys, r.Key) {
			continue
		}
		if r.Supersedes(got) {
			got = r
		}
	}
	return got, nil
}

// settled is the answer to a call whose result is indeterminate. The
// results stream keeps that result after an operator resolved the call in
// the ledger, so the ledger (through the consumers' lookup service) is
// asked: a call resolved as done is answered with the operator's output, a
// failed one with its error; one resolved as not run is a notRunError.
// One that now waits for a person's approval is answered so (pending, not
// in flight). If the lookup fails (no consumer serves it), the
// indeterminate result stands.
func (s *Server) settled(ctx context.Context, r *jobs.Result) (*jobs.Result, error) {
	l, err := s.client.Lookup(ctx, r.Key)
	if err != nil {
		s.cfg.Logger.Warn("MCP front door: ledger lookup failed; the call is answered indeterminate", "key", r.Key, "error", err)
		return r, nil
	}
	resolved := *r
	resolved.Output, resolved.Error = nil, nil
	switch l.State {
	case jobs.LookupCompleted:
		resolved.Status, resolved.Output = jobs.StatusOK, l.Output
	case jobs.LookupFailed:
		resolved.Status, resolved.Error = jobs.StatusError, l.Error
	case jobs.LookupUnknown:
		return nil, &notRunError{key: r.Key}
	case jobs.LookupInFlight: // released and running again
		return nil, errRunningAgain
	case jobs.LookupAwaitingApproval: // released, and its next delivery asked a person
		resolved.Status, resolved.Approval = jobs.StatusAwaitingApproval, l.Approval
	default:
		return r, nil
	}
	return &resolved, nil
}

// notRunError is a call whose indeterminate result an operator resolved as
// not run (or whose ledger row is gone): its row is released, and the call
// runs at its next delivery. The same job published again is dropped
// within the jobs stream's duplicate window, so the client is told when to
// send it again.
type notRunError struct{ key string }

func (e *notRunError) Error() string {
	return fmt.Sprintf("toolq: call %s: its outcome was unknown, and an operator resolved it as not run (consumer ledger resolve --not-run): "+
		"it runs at its next delivery. The same tools/call sent again within the jobs stream's duplicate window (2 minutes by default) "+
		"after its first is dropped as a re-publication: send it again after that, or have the operator run it now (publisher replay); it will not run twice", e.key)
}

// results is the reader of every conversation's results, started at the
// first call and again after it stopped.
func (s *Server) results(ctx context.Context) (*jobs.Results, error) {
	s.readerMu.Lock()
	defer s.readerMu.Unlock()
	if s.ctx.Err() != nil {
		return nil, errClosed
	}
	if s.reader == nil {
		r, err := s.client.Results(ctx, "")
		if err != nil {
			return nil, err
		}
		s.reader = r
	}
	return s.reader, nil
}

// dropResults forgets a reader that stopped, so that the next call starts
// another.
func (s *Server) dropResults(r *jobs.Results) {
	s.readerMu.Lock()
	defer s.readerMu.Unlock()
	if s.reader == r {
		s.reader = nil
		go r.Close()
	}
}
