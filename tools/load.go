package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// The registry file: a list of tools, each with exactly one executor.
//
//	tools:
//	  - name: send_payment
//	    class: keyed_write          # read | keyed_write | unkeyed_write | transactional_write
//	    ledger: true                # keyed_write only; default true
//	    timeout: 10s
//	    lease: 30s                  # default max(2×timeout, timeout+5s); must exceed timeout
//	    concurrency: 16
//	    retention: 90d              # keep finished rows this long (default: the top-level retention)
//	    breaker: {failures: 5, open_for: 30s, half_open: 1}
//	    approval:                   # or approval: required (every call); writes with a ledger only
//	      when: args.amount_cents > 50000   # CEL over the args; absent: every call
//	      ttl: 2h                   # how long a call waits for a decision (default 24h, at most 30d)
//	      group: finance            # who decides (default approvers)
//	    schema: {type: object, …}   # JSON Schema of the args, written in YAML
//	    http:
//	      method: POST
//	      url: ${TOOLQ_SANDBOX_URL:-http://127.0.0.1:8089}/v1/payments
//	      headers: {Authorization: "Bearer ${PAYMENTS_TOKEN}"}
//	      idempotency_header: Idempotency-Key   # "-": do not send the key
//	      max_response_bytes: 1048576
//	  - name: echo
//	    class: read
//	    builtin: echo               # a Go function given in Config.Builtins
//	  - name: record_refund
//	    class: transactional_write  # its effect commits with its ledger row
//	    schema: {type: object, properties: {order_id: {type: string}, amount_cents: {type: integer}}}
//	    sql:                        # one statement in the ledger's database (see SQL)
//	      statement: INSERT INTO refunds (order_id, amount_cents, idempotency_key) VALUES (@order_id, @amount_cents, @key) RETURNING id
//	      output: row               # rows (default) | row | affected
//
// A top-level retention: 31d is every tool's default (see Retention).
//
// ${VAR} takes an environment variable (unset: an error naming it);
// ${VAR:-default} falls back to the default; ${file:/run/secrets/name} takes
// a file's content, one trailing newline trimmed (unreadable: an error
// naming the path). They work in url and headers (an mcp tool's url,
// command, env and headers), and what they give is a secret: shown
// nowhere, redacted from results, errors, spans and a stdio server's
// standard error (see expand and secrets). A default is not a secret: it is
// written in the file.
type fileSpec struct {
	Retention string     `yaml:"retention"` // the default of every tool's (see Retention)
	Tools     []toolSpec `yaml:"tools"`
}

type toolSpec struct {
	Name        string       `yaml:"name"`
	Description string       `yaml:"description"`
	Class       string       `yaml:"class"`
	Ledger      *bool        `yaml:"ledger"`
	Timeout     string       `yaml:"timeout"`
	Lease       string       `yaml:"lease"`
	Concurrency int          `yaml:"concurrency"`
	Retention   string       `yaml:"retention"`
	Breaker     *breakerSpec `yaml:"breaker"`
	Schema      yaml.Node    `yaml:"schema"`
	HTTP        *httpSpec    `yaml:"http"`
	MCP         *mcpSpec     `yaml:"mcp"`
	SQL         *sqlSpec     `yaml:"sql"`
	Builtin     string       `yaml:"builtin"`
	Approval    yaml.Node    `yaml:"approval"` // required, or a mapping (see parseApproval)
}

type breakerSpec struct {
	Failures uint32 `yaml:"failures"`
	OpenFor  string `yaml:"open_for"`
	HalfOpen uint32 `yaml:"half_open"`
}

type httpSpec struct {
	Method               string            `yaml:"method"`
	URL                  string            `yaml:"url"`
	Headers              map[string]string `yaml:"headers"`
	IdempotencyHeader    string            `yaml:"idempotency_header"`
	IdempotencyForm      string            `yaml:"idempotency_form"`
	IdempotencyBodyField string            `yaml:"idempotency_body_field"`
	MaxResponseBytes     int64             `yaml:"max_response_bytes"`
}

type sqlSpec struct {
	Statement      string `yaml:"statement"`
	Output         string `yaml:"output"`
	MaxOutputBytes int64  `yaml:"max_output_bytes"`
}

type mcpSpec struct {
	URL               string            `yaml:"url"`
	Command           yaml.Node         `yaml:"command"` // a list, or a string split at spaces
	Env               map[string]string `yaml:"env"`
	Headers           map[string]string `yaml:"headers"`
	Tool              string            `yaml:"tool"`
	IdempotencyHeader string            `yaml:"idempotency_header"`
	IdempotencyForm   string            `yaml:"idempotency_form"`
	MaxResponseBytes  int64             `yaml:"max_response_bytes"`
	InheritEnv        bool              `yaml:"inherit_env"`
	IsError           string            `yaml:"is_error"`
}

// Load reads the registry file at path with cfg (see Parse). Errors name
// the file, and the tool and field where one is at fault (a
// *DefinitionError); a file that cannot be read gives the *fs.PathError,
// wrapped.
func Load(path string, cfg Config) (*Registry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tools: %w", err)
	}
	return Parse(data, path, cfg)
}

// Parse reads a registry from YAML and builds it with NewRegistry; name is
// used in errors. ${VAR} references are looked up with cfg.Getenv and
// `builtin: name` in cfg.Builtins. Errors are *DefinitionError values naming
// name, and the tool and field at fault.
func Parse(data []byte, name string, cfg Config) (*Registry, error) {
	cfg = cfg.withDefaults()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f fileSpec
	if err := dec.Decode(&f); err != nil {
		return nil, &DefinitionError{File: name, Msg: explainYAML(err)}
	}
	if len(f.Tools) == 0 {
		return nil, &DefinitionError{File: name, Field: "tools", Msg: "no tools defined"}
	}
	defaultRetention, err := parseRetention(f.Retention)
	if err != nil {
		return nil, &DefinitionError{File: name, Field: "retention", Msg: err.Error()}
	}
	defs := make([]Definition, 0, len(f.Tools))
	for i := range f.Tools {
		d, err := f.Tools[i].definition(cfg)
		if err == nil && d.Retention == 0 {
			d.Retention = defaultRetention
		}
		if err != nil {
			var de *DefinitionError
			if errors.As(err, &de) {
				de.File = name
				if de.Tool == "" {
					de.Tool = f.Tools[i].Name
				}
				return nil, de
			}
			return nil, &DefinitionError{File: name, Tool: f.Tools[i].Name, Msg: err.Error()}
		}
		defs = append(defs, d)
	}
	shareMCPSessions(defs)
	r, err := NewRegistry(defs, cfg)
	if err != nil {
		var de *DefinitionError
		if errors.As(err, &de) {
			de.File = name
		}
		return nil, err
	}
	return r, nil
}

func (s *toolSpec) definition(cfg Config) (Definition, error) {
	bad := func(field, format string, args ...any) error {
		return &DefinitionError{Tool: s.Name, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	d := Definition{Name: s.Name, Description: s.Description, Class: Class(s.Class), Ledger: s.Ledger, Concurrency: s.Concurrency}
	if s.Name == "" {
		return d, bad("name", "missing")
	}
	var err error
	if d.Timeout, err = parseDuration(s.Timeout); err != nil {
		return d, bad("timeout", "%v", err)
	}
	if d.Lease, err = parseDuration(s.Lease); err != nil {
		return d, bad("lease", "%v", err)
	}
	if d.Retention, err = parseRetention(s.Retention); err != nil {
		return d, bad("retention", "%v", err)
	}
	if s.Breaker != nil {
		d.Breaker = Breaker{Failures: s.Breaker.Failures, HalfOpen: s.Breaker.HalfOpen}
		if d.Breaker.OpenFor, err = parseDuration(s.Breaker.OpenFor); err != nil {
			return d, bad("breaker.open_for", "%v", err)
		}
	}
	if s.Schema.Kind != 0 {
		var v any
		if err := s.Schema.Decode(&v); err != nil {
			return d, bad("schema", "%v", err)
		}
		if d.Schema, err = json.Marshal(v); err != nil {
			return d, bad("schema", "cannot be written as JSON: %v", err)
		}
	}
	if s.Approval.Kind != 0 {
		if d.Approval, err = parseApproval(s.Name, &s.Approval); err != nil {
			return d, err
		}
	}
	if given := s.executors(); len(given) > 1 {
		return d, bad(given[1], "a tool has one executor: %s, not more (%s)", strings.Join(executorFields, ", "), strings.Join(given, " and "))
	} else if len(given) == 1 && d.Class == TransactionalWrite && given[0] != "sql" && given[0] != "builtin" {
		return d, bad(given[0], "a transactional_write writes in the ledger's transaction: give it sql, or builtin naming a TxExecutor")
	}
	switch {
	case s.HTTP != nil:
		h := HTTP{Method: s.HTTP.Method, IdempotencyHeader: s.HTTP.IdempotencyHeader, IdempotencyForm: s.HTTP.IdempotencyForm,
			IdempotencyBodyField: s.HTTP.IdempotencyBodyField, MaxResponseBytes: s.HTTP.MaxResponseBytes}
		if h.URL, err = expandURL(s.HTTP.URL, cfg.Getenv, &h.secrets); err != nil {
			return d, bad("http.url", "%v", err)
		}
		h.Headers = map[string]string{}
		for k, v := range s.HTTP.Headers {
			if h.Headers[k], err = expandSecret(v, cfg.Getenv, &h.secrets); err != nil {
				return d, bad("http.headers."+k, "%v", err)
			}
		}
		exec, err := HTTPExecutor(h)
		if err != nil {
			return d, bad("http", "%v", err)
		}
		forwards := exec.ForwardsKey()
		d.Executor, d.Downstream, d.ForwardsKey = exec, exec.Downstream(), &forwards
	case s.MCP != nil:
		exec, err := s.MCP.executor(s.Name, cfg.Getenv)
		if err != nil {
			var de *DefinitionError
			if errors.As(err, &de) {
				return d, err
			}
			return d, bad("mcp", "%v", err)
		}
		forwards := true // in _meta, whatever the header
		d.Executor, d.Downstream, d.ForwardsKey = exec, exec.Downstream(), &forwards
	case s.SQL != nil:
		if d.Class != TransactionalWrite {
			return d, bad("sql", "only a transactional_write runs SQL, in the ledger's transaction (this tool's class is %q)", d.Class)
		}
		exec, err := SQLExecutor(SQL{Statement: s.SQL.Statement, Output: s.SQL.Output, MaxOutputBytes: s.SQL.MaxOutputBytes})
		if err != nil {
			return d, bad("sql", "%v", err)
		}
		d.TxExecutor = exec
	case s.Builtin != "" && d.Class == TransactionalWrite:
		e, ok := cfg.TxBuiltins[s.Builtin]
		if !ok {
			return d, bad("builtin", "no built-in transactional executor called %q (a transactional_write's is a TxExecutor, in Config.TxBuiltins)", s.Builtin)
		}
		d.TxExecutor = e
	case s.Builtin != "":
		e, ok := cfg.Builtins[s.Builtin]
		if !ok {
			return d, bad("builtin", "no built-in executor called %q", s.Builtin)
		}
		d.Executor = e
	default:
		return d, bad("http", "missing executor: give one of %s", strings.Join(executorFields, ", "))
	}
	return d, nil
}

// executorFields are the fields of a tool that name its executor; a tool
// gives exactly one.
var executorFields = []string{"http", "mcp", "sql", "builtin"}

// executors returns the executor fields s gives, in executorFields' order.
func (s *toolSpec) executors() []string {
	present := map[string]bool{"http": s.HTTP != nil, "mcp": s.MCP != nil, "sql": s.SQL != nil, "builtin": s.Builtin != ""}
	var given []string
	for _, f := range executorFields {
		if present[f] {
			given = append(given, f)
		}
	}
	return given
}

// executor builds the MCP executor of tool name, its ${VAR} references
// expanded in url, command, env and headers.
func (s *mcpSpec) executor(name string, getenv func(string) string) (*MCP, error) {
	bad := func(field string, err error) error {
		return &DefinitionError{Tool: name, Field: "mcp." + field, Msg: err.Error()}
	}
	m := MCP{Tool: s.Tool, IdempotencyHeader: s.IdempotencyHeader, IdempotencyForm: s.IdempotencyForm, MaxResponseBytes: s.MaxResponseBytes,
		InheritEnv: s.InheritEnv, IsError: s.IsError}
	if m.Tool == "" {
		m.Tool = name
	}
	m.URL = s.URL
	switch s.Command.Kind {
	case 0:
	case yaml.ScalarNode:
		m.Command = strings.Fields(s.Command.Value)
	case yaml.SequenceNode:
		if err := s.Command.Decode(&m.Command); err != nil {
			return nil, bad("command", fmt.Errorf("want a list of strings: %v", err))
		}
	default:
		return nil, bad("command", errors.New("want a list of strings (the program, then its arguments) or one string split at spaces"))
	}
	m.Env, m.Headers = s.Env, s.Headers
	m, err := m.expanded(getenv)
	if err != nil {
		var fe *fieldError
		if errors.As(err, &fe) {
			return nil, bad(fe.field, fe.err)
		}
		return nil, err
	}
	return MCPExecutor(m)
}

// expanded is m with the ${…} references of its url, command, env and
// headers replaced (see expand), their values kept in m.secrets; an error
// is a *fieldError.
func (m MCP) expanded(getenv func(string) string) (MCP, error) {
	var err error
	m.secrets = nil
	if m.URL, err = expandURL(m.URL, getenv, &m.secrets); err != nil {
		return m, &fieldError{"url", err}
	}
	m.Command = slices.Clone(m.Command)
	for i, w := range m.Command {
		if m.Command[i], err = expandSecret(w, getenv, &m.secrets); err != nil {
			return m, &fieldError{"command", err}
		}
	}
	expand := func(field string, kv map[string]string) (map[string]string, error) {
		if kv == nil {
			return nil, nil
		}
		out := make(map[string]string, len(kv))
		for k, v := range kv {
			if out[k], err = expandSecret(v, getenv, &m.secrets); err != nil {
				return nil, &fieldError{field + "." + k, err}
			}
		}
		return out, nil
	}
	if m.Env, err = expand("env", m.Env); err != nil {
		return m, err
	}
	if m.Headers, err = expand("headers", m.Headers); err != nil {
		return m, err
	}
	return m, nil
}

// fieldError is an error of one field of a definition.
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string { return e.field + ": " + e.err.Error() }

func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is not a positive duration (e.g. 10s, 2m)", s)
	}
	return d, nil
}

// unknownField is how yaml.v3 reports a field a struct does not have.
var unknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type tools\.(\w+)`)

// specFields are the fields of each part of a registry file, for "did you
// mean".
var specFields = map[string][]string{}

func init() {
	var collect func(t reflect.Type)
	collect = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || t.Name() == "" && t.NumField() == 0 {
			return
		}
		var names []string
		for f := range t.Fields() {
			if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag != "" && tag != "-" {
				names = append(names, tag)
				if f.Type.Kind() == reflect.Struct && f.Type.Name() == "" {
					// an anonymous struct: yaml.v3 names it by its shape;
					// its fields count under the parent's name too
					for g := range f.Type.Fields() {
						if tag, _, _ := strings.Cut(g.Tag.Get("yaml"), ","); tag != "" {
							specFields[t.Name()+"."+tag] = nil
						}
					}
				}
				collect(f.Type)
			}
		}
		if t.Name() != "" {
			specFields[t.Name()] = names
		}
	}
	collect(reflect.TypeFor[fileSpec]())
}

// explainYAML turns the YAML decoder's errors into one line, an unknown
// field with the field it most likely meant.
func explainYAML(err error) string {
	msg := oneLine(err.Error())
	return unknownField.ReplaceAllStringFunc(msg, func(m string) string {
		sub := unknownField.FindStringSubmatch(m)
		line, field, typ := sub[1], sub[2], sub[3]
		out := fmt.Sprintf("line %s: unknown field %q", line, field)
		if best := closest(field, specFields[typ]); best != "" {
			out += fmt.Sprintf(" (did you mean %q?)", best)
		} else if names := specFields[typ]; len(names) > 0 {
			out += " (known: " + strings.Join(names, ", ") + ")"
		}
		return out
	})
}

// closest is the name within edit distance 2 of s (a third of it for
// long names), or "".
func closest(s string, names []string) string {
	best, bestD := "", max(2, len(s)/3)+1
	for _, n := range names {
		if d := editDistance(s, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
