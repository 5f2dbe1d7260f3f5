// Package tools is toolq's tool registry: for each tool its class, JSON
// Schema, executor, timeout, lease, concurrency limit and circuit breaker,
// loaded from one YAML file or built in Go. It also holds the executors (HTTP
// and built-in Go functions) and the classification of their outcomes into
// the four kinds the consumer acts on. Registries are built with one Config
// (logger, environment, built-in executors) by NewRegistry, Parse and Load.
package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolq/toolq/internal/jcs"
	"github.com/toolq/toolq/jobs"
)

// Class is decided once per tool, at registration: it says what toolq does
// about duplicates and uncertain outcomes.
type Class string

const (
	// Read tools have no side effect: no ledger, no key, retried freely.
	Read Class = "read"
	// KeyedWrite tools call a downstream that honours Idempotency-Key: the key
	// is forwarded, and an uncertain outcome is retried with the same key.
	KeyedWrite Class = "keyed_write"
	// UnkeyedWrite tools call a downstream with no dedupe: the ledger is
	// always used and an uncertain outcome is never re-run automatically.
	UnkeyedWrite Class = "unkeyed_write"
	// TransactionalWrite tools write to the ledger's own Postgres database,
	// in the transaction that completes their claim (a TxExecutor): the
	// effect and the ledger row commit together or not at all, so a call
	// that did not commit left nothing and simply runs again.
	TransactionalWrite Class = "transactional_write"
)

// Valid reports whether c is one of the four classes.
func (c Class) Valid() bool {
	return c == Read || c == KeyedWrite || c == UnkeyedWrite || c == TransactionalWrite
}

// Defaults applied by NewRegistry to what a Definition leaves zero.
const (
	DefaultTimeout      = 30 * time.Second
	DefaultConcurrency  = 16
	DefaultFailures     = 5
	DefaultOpenFor      = 30 * time.Second
	DefaultMaxResponse  = 1 << 20
	DefaultNotSentDelay = time.Second
)

// ErrInvalidArgs is wrapped by the error of Tool.Validate when the arguments
// fail the tool's schema (or are not a canonical JSON object).
var ErrInvalidArgs = errors.New("tools: invalid arguments")

// Request is one call handed to an executor.
type Request struct {
	Tool      string
	Key       string          // the idempotency key; empty for read tools
	Args      json.RawMessage // the arguments, canonical (RFC 8785)
	ToolUseID string
	// ConversationID and TurnIndex are the call's, as the job gives them.
	ConversationID string
	TurnIndex      int64
	// Attempt is the ledger attempt: 1 for the key's first claim, one more
	// for each takeover; 0 without a ledger. It is no fencing token across
	// holders: after a Postgres crash that lost a keyed write's claim, the
	// next claim is made at the same attempt (the ledger fences the first
	// holder by its claim token). The Idempotency-Key is what a downstream
	// dedups by.
	Attempt int64
}

// Executor runs calls of one tool. It returns the output (JSON), or an error
// that Classify maps to an Outcome: return NotSentError, DefiniteError or
// AmbiguousError to say which; any other error counts as Ambiguous.
type Executor interface {
	Execute(ctx context.Context, req Request) (json.RawMessage, error)
}

// ArgsChecker is an Executor or a TxExecutor that refuses some args a
// schema cannot tell apart (the HTTP executor: args that would carry the
// idempotency key's member; the sql executor: a number it would not bind
// as written). Tool.Validate asks it, so that such a call is rejected
// before it is claimed.
type ArgsChecker interface {
	CheckArgs(args json.RawMessage) error
}

// ExecutorFunc adapts a function to Executor: the built-in executor.
type ExecutorFunc func(ctx context.Context, req Request) (json.RawMessage, error)

// Execute calls f.
func (f ExecutorFunc) Execute(ctx context.Context, req Request) (json.RawMessage, error) {
	return f(ctx, req)
}

// Breaker configures a tool's circuit breaker. Tools that share a downstream
// share one breaker, so they must agree on its settings.
type Breaker struct {
	Failures uint32        // consecutive not-sent or ambiguous failures that open it (default 5)
	OpenFor  time.Duration // how long it stays open before letting a trial call through (default 30s)
	HalfOpen uint32        // trial calls allowed while half-open (default 1)
}

// Definition describes one tool, in Go or as loaded from YAML.
type Definition struct {
	Name        string
	Description string
	Class       Class
	// Ledger turns the local ledger off for a keyed write whose downstream
	// dedupes on its own (nil: on). Read tools never use it; unkeyed writes
	// always do.
	Ledger      *bool
	Schema      json.RawMessage // JSON Schema (draft 2020-12 unless $schema says otherwise) of the args
	Timeout     time.Duration   // per call (default 30s)
	Lease       time.Duration   // ledger lease; must exceed Timeout (default max(2×Timeout, Timeout+5s))
	Concurrency int             // calls running at once in one consumer (default 16)
	Retention   time.Duration   // how long the ledger keeps its finished rows at least (0: not stated; see Retention)
	Breaker     Breaker
	Executor    Executor
	// TxExecutor is the executor of a transactional_write, and of no other
	// class (which take an Executor).
	TxExecutor TxExecutor
	// ForwardsKey says whether the executor hands the key downstream. HTTP
	// executors set it from their configuration; for others it is taken as
	// true for write classes (they receive Request.Key).
	ForwardsKey *bool
	// Downstream names what the executor talks to; tools with the same
	// downstream share a breaker. HTTP executors set it to scheme://host;
	// empty: the tool's own name.
	Downstream string
	// Approval is the tool's approval policy (nil: its calls need none);
	// NewRegistry fills its defaults and compiles its condition.
	Approval *Approval
}

// Tool is a registered tool. Its methods are safe for concurrent use.
type Tool struct {
	Name        string
	Description string
	Class       Class
	UsesLedger  bool
	ForwardsKey bool
	Timeout     time.Duration
	Lease       time.Duration
	Concurrency int
	Retention   time.Duration
	Downstream  string
	SchemaJSON  json.RawMessage
	Approval    *Approval // nil: its calls need no approval

	executor   Executor
	txExecutor TxExecutor
	schema     *jsonschema.Schema
	slots      chan struct{}
	breaker    *breaker
}

// Registry is the set of tools a consumer runs.
type Registry struct {
	tools    map[string]*Tool
	names    []string
	breakers map[string]*breaker
}

// A DefinitionError names the tool and field of a definition that is wrong.
type DefinitionError struct {
	File  string // set by Load
	Tool  string
	Field string
	Msg   string
}

func (e *DefinitionError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File + ": ")
	}
	if e.Tool != "" {
		fmt.Fprintf(&b, "tool %q: ", e.Tool)
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// NewRegistry validates the definitions, fills their defaults, compiles their
// schemas and returns the registry. Errors are *DefinitionError values naming
// the tool and field: a bad or duplicate name, an unknown class, a ledger
// setting the class forbids, an invalid schema, a lease not above the
// timeout, a missing executor or one of the wrong kind for the class (a
// TxExecutor is a transactional_write's, an Executor every other class's),
// an SQL statement naming a parameter the schema does not declare, breakers
// that disagree on one downstream, an approval on a tool without a ledger
// claim or with a bad ttl, group or condition (see Approval).
// Of cfg it uses the Logger.
func NewRegistry(defs []Definition, cfg Config) (*Registry, error) {
	cfg = cfg.withDefaults()
	r := &Registry{tools: map[string]*Tool{}, breakers: map[string]*breaker{}}
	breakerOwner := map[string]string{}
	for i := range defs {
		d := defs[i]
		bad := func(field, format string, args ...any) error {
			return &DefinitionError{Tool: d.Name, Field: field, Msg: fmt.Sprintf(format, args...)}
		}
		if !jobs.ValidToolName(d.Name) {
			return nil, bad("name", "must match ^[a-zA-Z0-9_-]{1,64}$")
		}
		if _, dup := r.tools[d.Name]; dup {
			return nil, bad("name", "defined twice")
		}
		if !d.Class.Valid() {
			return nil, bad("class", "unknown class %q (want read, keyed_write, unkeyed_write or transactional_write)", d.Class)
		}
		t := &Tool{Name: d.Name, Description: d.Description, Class: d.Class, executor: d.Executor, txExecutor: d.TxExecutor, Downstream: d.Downstream}
		transactional := d.Class == TransactionalWrite
		switch {
		case transactional && d.Executor != nil:
			return nil, bad("executor", "a transactional_write runs in the ledger's transaction: give it a TxExecutor, not an Executor")
		case transactional && d.TxExecutor == nil:
			return nil, bad("tx_executor", "missing")
		case !transactional && d.TxExecutor != nil:
			return nil, bad("tx_executor", "only a transactional_write runs in the ledger's transaction; a %s takes an Executor", d.Class)
		case !transactional && d.Executor == nil:
			return nil, bad("executor", "missing")
		}
		switch {
		case d.Class == Read:
			if d.Ledger != nil && *d.Ledger {
				return nil, bad("ledger", "a read tool has no side effect to claim; remove the setting")
			}
		case d.Class == UnkeyedWrite:
			if d.Ledger != nil && !*d.Ledger {
				return nil, bad("ledger", "an unkeyed write always uses the ledger: nothing else stops a duplicate")
			}
			t.UsesLedger = true
		case transactional:
			if d.Ledger != nil && !*d.Ledger {
				return nil, bad("ledger", "a transactional write always uses the ledger: its effect commits in the ledger's transaction")
			}
			t.UsesLedger = true
		default:
			t.UsesLedger = d.Ledger == nil || *d.Ledger
		}
		// A transactional write has no downstream to hand its key to (its
		// executor has it in Request.Key).
		t.ForwardsKey = (d.Class == KeyedWrite || d.Class == UnkeyedWrite) && (d.ForwardsKey == nil || *d.ForwardsKey)
		t.Timeout = d.Timeout
		if t.Timeout == 0 {
			t.Timeout = DefaultTimeout
		}
		if t.Timeout < 0 {
			return nil, bad("timeout", "must be positive")
		}
		t.Lease = d.Lease
		if t.Lease == 0 {
			t.Lease = max(2*t.Timeout, t.Timeout+5*time.Second)
		}
		if t.Lease <= t.Timeout {
			return nil, bad("lease", "%s must exceed the timeout (%s): a lease that ends while the call may still run lets a second one start", t.Lease, t.Timeout)
		}
		t.Concurrency = d.Concurrency
		if t.Retention = d.Retention; t.Retention < 0 {
			return nil, bad("retention", "%s must not be negative", t.Retention)
		}
		if t.Concurrency == 0 {
			t.Concurrency = DefaultConcurrency
		}
		if t.Concurrency < 0 {
			return nil, bad("concurrency", "must be positive")
		}
		t.slots = make(chan struct{}, t.Concurrency)
		if len(bytes.TrimSpace(d.Schema)) == 0 {
			return nil, bad("schema", "missing: every tool declares the JSON Schema of its args")
		}
		sch, err := compileSchema(d.Name, d.Schema)
		if err != nil {
			return nil, bad("schema", "%v", err)
		}
		t.schema, t.SchemaJSON = sch, d.Schema
		if sq, ok := d.TxExecutor.(*SQL); ok {
			if err := sq.checkParams(d.Schema); err != nil {
				return nil, bad("sql.statement", "%v", err)
			}
		}
		if d.Approval != nil {
			if t.Approval, err = d.Approval.compiled(d.Name, d.Class, t.UsesLedger, d.Schema); err != nil {
				return nil, err
			}
		}
		if t.Downstream == "" {
			t.Downstream = "tool:" + d.Name
		}
		bs := d.Breaker.withDefaults()
		if bs.OpenFor < 0 {
			return nil, bad("breaker.open_for", "must be positive")
		}
		if b, ok := r.breakers[t.Downstream]; ok {
			if b.settings != bs {
				return nil, bad("breaker", "differs from tool %q, which shares the downstream %s (one breaker per downstream)", breakerOwner[t.Downstream], t.Downstream)
			}
			t.breaker = b
		} else {
			t.breaker = newBreaker(t.Downstream, bs, cfg.Logger)
			r.breakers[t.Downstream] = t.breaker
			breakerOwner[t.Downstream] = d.Name
		}
		r.tools[d.Name] = t
		r.names = append(r.names, d.Name)
	}
	sort.Strings(r.names)
	return r, nil
}

// Close releases what the tools' executors hold open: the sessions of MCP
// tools, and the servers a stdio MCP tool started. Calls still running end
// with their sessions.
func (r *Registry) Close() error {
	var errs []error
	for _, t := range r.tools {
		if c, ok := t.executor.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// Lookup returns the tool called name.
func (r *Registry) Lookup(name string) (*Tool, bool) {
	t, ok := r.tools[name]
	return t, ok
}

// Tools returns the tools sorted by name.
func (r *Registry) Tools() []*Tool {
	out := make([]*Tool, len(r.names))
	for i, n := range r.names {
		out[i] = r.tools[n]
	}
	return out
}

// Validate checks args against the tool's schema after the contract's own
// rules (a canonicalizable JSON object). It is the one place args are
// checked: call it before Run (the worker does, before it claims the key, so
// that invalid args are rejected without a ledger row). The error wraps
// ErrInvalidArgs and says, in one line, where and why.
func (t *Tool) Validate(args json.RawMessage) error {
	v, err := jcs.ParseStrict(args)
	if err == nil && v.Kind != jcs.KindObject {
		_, err = jcs.CanonicalizeObject(args) // the contract's error for a value that is no object
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgs, err)
	}
	return t.ValidateInstance(args, v.Instance())
}

// ValidateInstance is Validate for args that have already passed the
// contract's rules, given with their instance as a JSON Schema validator
// takes them: the worker's, whose strict parse of the job made the key
// (jobs.Material.ArgsInstance).
func (t *Tool) ValidateInstance(args json.RawMessage, inst any) error {
	if err := t.schema.Validate(inst); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalidArgs, schemaReason(err))
	}
	for _, e := range []any{t.executor, t.txExecutor} {
		if c, ok := e.(ArgsChecker); ok {
			if err := c.CheckArgs(args); err != nil {
				return fmt.Errorf("%w: %v", ErrInvalidArgs, err)
			}
		}
	}
	return nil
}

// Run waits for one of the tool's concurrency slots and runs the executor
// under the tool's timeout and circuit breaker. req.Args must have passed
// Validate: Run does not check them again. ctx governs the wait to start:
// once the call has started it runs to its end or its timeout, whatever
// becomes of ctx, because a write cut off halfway has an unknown outcome.
// The error, if any, is an *Error (see Classify); ending ctx before the
// start gives NotSent, and an open breaker gives NotSent with its remaining
// open time as RetryAfter.
//
// With BeforeSend, Run calls the check once it holds a slot, right before
// the call is sent; the timeout starts after it. A transactional_write does
// not run here (see RunTx): Run sends nothing and answers NotSent with code
// CodeTransactional.
func (t *Tool) Run(ctx context.Context, req Request, opts ...RunOption) (json.RawMessage, error) {
	if t.executor == nil {
		return nil, NotSentError(CodeTransactional, "a transactional_write runs with RunTx, in the ledger's transaction", 0, nil)
	}
	if !t.ForwardsKey {
		req.Key = ""
	}
	var o runOptions
	for _, opt := range opts {
		opt(&o)
	}
	select {
	case t.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, NotSentError(CodeCancelled, "gave up waiting for a concurrency slot", 0, ctx.Err())
	}
	defer func() { <-t.slots }()
	if err := ctx.Err(); err != nil {
		return nil, NotSentError(CodeCancelled, "cancelled before sending", 0, err)
	}
	if o.beforeSend != nil {
		if err := o.beforeSend(ctx); err != nil {
			return nil, NotSentError(CodeNotStarted, "not sent: "+err.Error(), 0, err)
		}
	}
	return t.breaker.run(func() (json.RawMessage, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.Timeout)
		defer cancel()
		out, err := t.executor.Execute(ctx, req)
		if err != nil {
			_, classified := Classify(err)
			if !utf8.ValidString(classified.Message) { // it is stored and published as text
				copied := *classified
				copied.Message = strings.ToValidUTF8(copied.Message, "\uFFFD")
				classified = &copied
			}
			return nil, classified
		}
		if !json.Valid(out) {
			return nil, AmbiguousError("invalid_output", "the executor returned output that is not JSON", 0, nil)
		}
		// json.Valid accepts invalid UTF-8 inside strings; the ledger and
		// the results stream take only valid text.
		return validUTF8(out), nil
	})
}

// A RunOption is a per-call knob of Run.
type RunOption func(*runOptions)

type runOptions struct {
	beforeSend func(context.Context) error
}

// BeforeSend has Run call check once the call holds one of the tool's
// concurrency slots, right before it is sent. A call may wait long for a
// slot: the check is the caller's last word on whether it should still go
// (the worker confirms there that it still holds the call's claim). An
// error from check stops the call: Run returns a NotSent error with code
// CodeNotStarted that wraps it.
func BeforeSend(check func(ctx context.Context) error) RunOption {
	return func(o *runOptions) { o.beforeSend = check }
}

// BreakerStates returns the state of each downstream's breaker ("closed",
// "open" or "half-open"), by downstream.
func (r *Registry) BreakerStates() map[string]string {
	out := make(map[string]string, len(r.breakers))
	for downstream, b := range r.breakers {
		out[downstream] = b.state()
	}
	return out
}

// BreakerState returns the state of the tool's breaker: "closed", "open" or
// "half-open".
func (t *Tool) BreakerState() string { return t.breaker.state() }

// BreakerWait reports how long the circuit breaker of the tool's downstream
// stays open: 0 when it would let a call through now. The worker asks
// before it claims a call, so that a call the breaker would refuse costs no
// ledger write and no try.
func (t *Tool) BreakerWait() time.Duration { return t.breaker.wait() }
