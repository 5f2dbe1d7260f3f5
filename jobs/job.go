// Package jobs is toolq's wire contract: the Job an agent publishes for each
// completed tool call, the Result toolq publishes back, their strict decoding
// and validation, the idempotency key derived from a call, and the names of the
// subjects, headers and streams they travel on.
//
// The key is
//
//	hex(sha256(conversation_id|turn_index|tool|ordinal|canonical(args)))[:32]
//
// where canonical is RFC 8785. Everything that could make two agents derive
// different keys for the same call, or one key for two calls, is rejected,
// never coerced.
package jobs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/toolq/toolq/internal/jcs"
)

// Version is the only version of the Job and Result bodies this package reads
// and writes.
const Version = 1

// ErrVersion is returned for a body whose version is not Version.
var ErrVersion = errors.New("jobs: unsupported version")

// Errors for a body or arguments that break a rule of the strict parser behind
// the key. Each names one rule; the error that comes back (a *SyntaxError,
// possibly inside a *FieldError) matches it with errors.Is.
var (
	ErrSyntax        = jcs.ErrSyntax        // not valid JSON
	ErrNotObject     = jcs.ErrNotObject     // args (or a body) that is not a JSON object
	ErrDuplicateName = jcs.ErrDuplicateName // a member name twice in one object, however spelled
	ErrInvalidUTF8   = jcs.ErrInvalidUTF8   // a string that is not valid UTF-8
	ErrLoneSurrogate = jcs.ErrLoneSurrogate // a \uD800–\uDFFF escape without its partner
	ErrNumberRange   = jcs.ErrNumberRange   // a number outside the double range
	ErrUnsafeInteger = jcs.ErrUnsafeInteger // an integer beyond ±2^53: send it as a string
	ErrTooDeep       = jcs.ErrTooDeep       // nesting deeper than 64 levels
)

// A SyntaxError reports the byte offset where a body or the arguments broke
// one of the rules above, and what was found there. It unwraps to the rule's
// sentinel error.
type SyntaxError = jcs.SyntaxError

// A FieldError names the field of a job that broke a rule, and the rule.
type FieldError struct {
	Field string
	Rule  string
	Err   error // the underlying cause, if any
}

// Error names the field, the rule and, when there is one, the cause.
func (e *FieldError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("jobs: %s: %s: %v", e.Field, e.Rule, e.Err)
	}
	return fmt.Sprintf("jobs: %s: %s", e.Field, e.Rule)
}

// Unwrap returns the underlying cause, or nil.
func (e *FieldError) Unwrap() error { return e.Err }

// Job is the body of one message on toolq.jobs.<tool>: one completed tool call
// of an assistant turn.
type Job struct {
	Version        int             `json:"version"`
	ConversationID string          `json:"conversation_id"`
	TurnIndex      int64           `json:"turn_index"`
	Ordinal        int64           `json:"ordinal"`
	Tool           string          `json:"tool"`
	ToolUseID      string          `json:"tool_use_id"`
	Args           json.RawMessage `json:"args"`
	CreatedAt      time.Time       `json:"created_at,omitzero"`
	// Tenant is the tenant whose call this is (docs/tenants.md): absent or
	// empty for the default tenant, whose subjects and keys are those of a
	// single-tenant deployment.
	Tenant string `json:"tenant,omitempty"`
}

// Call returns the part of the job that its key is derived from.
func (j *Job) Call() Call {
	return Call{
		Tenant:         j.Tenant,
		ConversationID: j.ConversationID,
		TurnIndex:      j.TurnIndex,
		Tool:           j.Tool,
		Ordinal:        j.Ordinal,
		Args:           j.Args,
	}
}

// Validate checks every field of the job, including its arguments, and returns
// a *FieldError naming the first that breaks its rule (ErrVersion for a wrong
// version).
func (j *Job) Validate() error {
	if j.Version != Version {
		return &FieldError{Field: "version", Rule: fmt.Sprintf("must be %d, got %d", Version, j.Version), Err: ErrVersion}
	}
	if err := j.Call().Validate(); err != nil {
		return err
	}
	if !toolUseIDPattern.MatchString(j.ToolUseID) {
		return &FieldError{Field: "tool_use_id", Rule: "must match " + toolUseIDPattern.String()}
	}
	if _, err := jcs.CanonicalizeObject(j.Args); err != nil {
		return &FieldError{Field: "args", Rule: "must be a canonicalizable JSON object", Err: err}
	}
	return nil
}

// Key derives the job's idempotency key; see Call.Key.
func (j *Job) Key() (string, error) { return j.Call().Key() }

// DecodeJob decodes and validates a job body. It is strict: the whole body must
// pass the strict parser behind the key (so duplicate fields, invalid UTF-8
// and the like are refused anywhere in it), unknown top-level fields are refused, version must
// be 1, and the required fields (version, conversation_id, turn_index, tool,
// tool_use_id, args) must be present. An absent ordinal is 0. Errors are
// *FieldError or *SyntaxError values.
func DecodeJob(body []byte) (*Job, error) {
	j, _, err := DecodeJobMaterial(body)
	return j, err
}

// DecodeJobMaterial is DecodeJob that also returns the material of the
// job's key (Call.Material), derived from the same parse of the body: the
// worker's decode parses each body once.
func DecodeJobMaterial(body []byte) (*Job, Material, error) {
	fs, err := decodeFields(body, jobFields)
	if err != nil {
		return nil, Material{}, err
	}
	var j Job
	if j.Version, err = intField(fs, "version", true); err != nil {
		return nil, Material{}, err
	}
	if j.Version != Version {
		return nil, Material{}, &FieldError{Field: "version", Rule: fmt.Sprintf("must be %d, got %d", Version, j.Version), Err: ErrVersion}
	}
	args, err := decodeCallFields(fs, &j)
	if err != nil {
		return nil, Material{}, err
	}
	if j.ToolUseID, err = stringField(fs, "tool_use_id", true); err != nil {
		return nil, Material{}, err
	}
	if m, ok := fs.get("created_at"); ok {
		if err := json.Unmarshal(m.Raw, &j.CreatedAt); err != nil {
			return nil, Material{}, &FieldError{Field: "created_at", Rule: "must be an RFC 3339 timestamp"}
		}
	}
	call := j.Call()
	if err := call.Validate(); err != nil {
		return nil, Material{}, err
	}
	if !toolUseIDPattern.MatchString(j.ToolUseID) {
		return nil, Material{}, &FieldError{Field: "tool_use_id", Rule: "must match " + toolUseIDPattern.String()}
	}
	if args.Kind != jcs.KindObject { // the body passed the strict parser: only the kind can be wrong
		_, err := jcs.CanonicalizeObject(j.Args)
		return nil, Material{}, &FieldError{Field: "args", Rule: "must be a canonicalizable JSON object", Err: err}
	}
	return &j, call.material(args), nil
}

// DecodeCall decodes the fields of a job body that the key depends on
// (conversation_id, turn_index, tool, ordinal, args), ignoring the others, and
// validates them. It serves `publisher key`, which derives keys for bodies that
// need not be complete jobs.
func DecodeCall(body []byte) (Call, error) {
	fs, err := decodeFields(body, nil)
	if err != nil {
		return Call{}, err
	}
	var j Job
	if _, err := decodeCallFields(fs, &j); err != nil {
		return Call{}, err
	}
	c := j.Call()
	return c, c.Validate()
}

var jobFields = map[string]bool{
	"version": true, "conversation_id": true, "turn_index": true, "ordinal": true,
	"tool": true, "tool_use_id": true, "args": true, "created_at": true, "tenant": true,
}

// fields are the top-level members of a body, in document order: a job has
// at most nine, and a scan finds one faster than a map built for the purpose.
type fields []jcs.Member

func (fs fields) get(name string) (jcs.Member, bool) {
	for _, m := range fs {
		if m.Name == name {
			return m, true
		}
	}
	return jcs.Member{}, false
}

// decodeFields checks the body with the strict parser and returns its
// top-level members; known, when not nil, lists the only names allowed.
// The parser has refused a name given twice.
func decodeFields(body []byte, known map[string]bool) (fields, error) {
	v, err := jcs.ParseStrictEnvelope(body) // the args inside may nest MaxDepth deep
	if err != nil {
		return nil, err
	}
	if v.Kind != jcs.KindObject {
		return nil, &FieldError{Field: "(body)", Rule: "must be a JSON object, got " + v.Kind.String()}
	}
	if known != nil {
		for _, m := range v.Members {
			if !known[m.Name] {
				return nil, &FieldError{Field: m.Name, Rule: "unknown field"}
			}
		}
	}
	return v.Members, nil
}

// decodeCallFields fills the fields of j that its key is derived from, and
// returns the parsed args.
func decodeCallFields(fs fields, j *Job) (*jcs.Value, error) {
	var err error
	if j.Tenant, err = stringField(fs, "tenant", false); err != nil {
		return nil, err
	}
	if j.ConversationID, err = stringField(fs, "conversation_id", true); err != nil {
		return nil, err
	}
	if j.TurnIndex, err = int64Field(fs, "turn_index", true); err != nil {
		return nil, err
	}
	if j.Tool, err = stringField(fs, "tool", true); err != nil {
		return nil, err
	}
	if j.Ordinal, err = int64Field(fs, "ordinal", false); err != nil {
		return nil, err
	}
	args, ok := fs.get("args")
	if !ok {
		return nil, &FieldError{Field: "args", Rule: "required"}
	}
	j.Args = bytes.Clone(args.Raw) // the job does not alias the caller's body
	return &args.Value, nil
}

func stringField(fs fields, name string, required bool) (string, error) {
	m, ok := fs.get(name)
	if !ok {
		if required {
			return "", &FieldError{Field: name, Rule: "required"}
		}
		return "", nil
	}
	if m.Value.Kind != jcs.KindString {
		return "", &FieldError{Field: name, Rule: "must be a string"}
	}
	return m.Value.String, nil
}

// decimalIntegerRule is what decimalInteger checks, as the error names it.
const decimalIntegerRule = "must be a non-negative integer (at most 16 digits), got "

// decimalInteger reports a non-negative integer written without sign,
// fraction or exponent, in at most 16 digits (^(0|[1-9][0-9]{0,15})$): 1.0
// or 1e0 is not a turn index.
func decimalInteger(lit []byte) bool {
	if len(lit) == 0 || len(lit) > 16 || (lit[0] == '0' && len(lit) > 1) {
		return false
	}
	for _, c := range lit {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func int64Field(fs fields, name string, required bool) (int64, error) {
	m, ok := fs.get(name)
	if !ok {
		if required {
			return 0, &FieldError{Field: name, Rule: "required"}
		}
		return 0, nil
	}
	if !decimalInteger(m.Raw) {
		return 0, &FieldError{Field: name, Rule: decimalIntegerRule + truncate(string(m.Raw), 32)}
	}
	return strconv.ParseInt(string(m.Raw), 10, 64)
}

func intField(fs fields, name string, required bool) (int, error) {
	n, err := int64Field(fs, name, required)
	return int(n), err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
