package tools

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	"go.yaml.in/yaml/v3"
)

// Defaults and bounds of an Approval, applied by NewRegistry.
const (
	DefaultApprovalTTL   = 24 * time.Hour
	DefaultApprovalGroup = "approvers"
	MaxApprovalTTL       = 30 * 24 * time.Hour
)

// approvalCostLimit bounds the work of one evaluation of an approval
// condition, in CEL's cost units (about one per operation, and one per ten
// bytes a string function reads): enough to look through a few thousand
// list items (exists over 3,000 costs 18,000), and about 0.1 s of a core at
// the most.
const approvalCostLimit = 100_000

// approvalGroup is what a group may be: it becomes a NATS subject token.
var approvalGroup = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Approval is a tool's approval policy: which of its calls wait for a
// person's decision, how long that decision may take, and who is asked.
//
//	approval: required              # every call
//	approval:
//	  when: args.amount_cents > 50000
//	  ttl: 2h
//	  group: finance
type Approval struct {
	// When is a CEL condition over the call's args (the variable args, a
	// map from member names to values; JSON numbers are doubles and compare
	// with integers); a call needs approval when it is true. Empty: every
	// call needs approval.
	When string
	// TTL is how long a call may wait for a decision (default 24h, at most
	// 30 days).
	TTL time.Duration
	// Group is who is asked (default "approvers"); it must match
	// ^[A-Za-z0-9_-]{1,64}$, as it becomes a NATS subject token.
	Group string

	program cel.Program // When compiled; nil for an empty When
}

// Needed reports whether the call with args needs approval: true when When
// is empty or holds for args, false on a nil Approval (no policy). A
// condition that cannot be evaluated over args (a member it reads is
// absent, a value of another type than it expects, the cost limit reached)
// gives true with the error: a call whose policy cannot be told needs
// approval. The caller logs the error.
func (a *Approval) Needed(args json.RawMessage) (bool, error) {
	if a == nil {
		return false, nil
	}
	if a.When == "" {
		return true, nil
	}
	if a.program == nil {
		return true, errors.New("tools: approval.when is not compiled: the Approval was not built by NewRegistry")
	}
	var v map[string]any
	if err := json.Unmarshal(args, &v); err != nil {
		return true, fmt.Errorf("tools: approval.when: the args are not a JSON object: %v", err)
	}
	out, _, err := a.program.Eval(map[string]any{"args": v})
	if err != nil {
		return true, fmt.Errorf("tools: approval.when %q: %w", a.When, err)
	}
	b, ok := out.Value().(bool)
	if !ok {
		return true, fmt.Errorf("tools: approval.when %q: is %s, not a condition (bool)", a.When, out.Type().TypeName())
	}
	return b, nil
}

// compiled returns a copy of a with its defaults filled in and When
// compiled against the tool's schema. Errors are *DefinitionError values
// naming the field.
func (a Approval) compiled(tool string, class Class, usesLedger bool, schema json.RawMessage) (*Approval, error) {
	bad := func(field, format string, args ...any) error {
		return &DefinitionError{Tool: tool, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case class == Read:
		return nil, bad("approval", "a read tool runs without a ledger claim, and approval needs one to hold the call while it waits: approval is for writes")
	case !usesLedger:
		return nil, bad("approval", "needs the ledger, and this %s has ledger: false", class)
	}
	if a.TTL == 0 {
		a.TTL = DefaultApprovalTTL
	}
	if a.TTL < 0 {
		return nil, bad("approval.ttl", "must be positive, is %s", a.TTL)
	}
	if a.TTL > MaxApprovalTTL {
		return nil, bad("approval.ttl", "must be at most 30d (720h), is %s", a.TTL)
	}
	if a.Group == "" {
		a.Group = DefaultApprovalGroup
	}
	if !approvalGroup.MatchString(a.Group) {
		return nil, bad("approval.group", "%q must match %s: it becomes a NATS subject token", a.Group, approvalGroup)
	}
	if a.When == "" {
		return &a, nil
	}
	var err error
	if a.program, err = compileCondition(a.When, schema); err != nil {
		return nil, bad("approval.when", "%v", err)
	}
	return &a, nil
}

// conditionEnv is the CEL environment of approval conditions: one
// variable, args.
var conditionEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
		cel.CrossTypeNumericComparisons(true),
	)
})

// compileCondition parses and checks src and makes its program. It refuses
// what type-checks but could never work over a tool's args: a result that
// is not a condition, a member the schema does not declare, arithmetic
// between an integer and an args number (a double). Errors give the line
// and column in src.
func compileCondition(src string, schema json.RawMessage) (cel.Program, error) {
	env, err := conditionEnv()
	if err != nil {
		return nil, err
	}
	checked, iss := env.Compile(src)
	if iss.Err() != nil {
		var msgs []string
		for _, e := range iss.Errors() {
			msgs = append(msgs, fmt.Sprintf("%d:%d: %s", e.Location.Line(), e.Location.Column()+1, oneLine(e.Message)))
		}
		return nil, errors.New(strings.Join(msgs, "; "))
	}
	if k := checked.OutputType().Kind(); k != types.BoolKind && k != types.DynKind {
		return nil, fmt.Errorf("must be a condition (bool), is %s", checked.OutputType())
	}
	if err := checkArgsUse(checked.NativeRep(), schema); err != nil {
		return nil, err
	}
	return env.Program(checked, cel.CostLimit(approvalCostLimit))
}

// checkArgsUse walks a checked condition for the uses of args that can
// only fail at run time, where they would send every call to approval: a
// member the schema's top-level properties do not declare (args.name,
// args["name"], "name" in args; only where the schema has properties), an
// integer in arithmetic with a value of args, an iteration variable that
// hides args.
func checkArgsUse(a *ast.AST, schema json.RawMessage) error {
	var sch struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	_ = json.Unmarshal(schema, &sch) // NewRegistry compiled it
	declared := func(name string) bool {
		_, ok := sch.Properties[name]
		return sch.Properties == nil || ok
	}
	info := a.SourceInfo()
	at := func(e ast.Expr, format string, args ...any) error {
		loc := info.GetStartLocation(e.ID())
		return fmt.Errorf("%d:%d: %s", loc.Line(), loc.Column()+1, fmt.Sprintf(format, args...))
	}
	undeclared := func(e ast.Expr, written, name string) error {
		msg := fmt.Sprintf("%s: the schema declares no property %s", written, name)
		if best := closest(name, slices.Sorted(maps.Keys(sch.Properties))); best != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", best)
		}
		return at(e, "%s", msg)
	}
	isArgs := func(e ast.Expr) bool { return e.Kind() == ast.IdentKind && e.AsIdent() == "args" }
	constString := func(e ast.Expr) (string, bool) {
		if e.Kind() != ast.LiteralKind {
			return "", false
		}
		s, ok := e.AsLiteral().Value().(string)
		return s, ok
	}
	for _, e := range ast.MatchDescendants(ast.NavigateAST(a), ast.AllMatcher()) {
		switch e.Kind() {
		case ast.ComprehensionKind:
			if c := e.AsComprehension(); c.IterVar() == "args" || c.IterVar2() == "args" {
				return at(e, "an iteration variable named args hides the call's args: name it otherwise")
			}
		case ast.SelectKind:
			if s := e.AsSelect(); isArgs(s.Operand()) && !declared(s.FieldName()) {
				return undeclared(s.Operand(), "args."+s.FieldName(), s.FieldName())
			}
		case ast.CallKind:
			c := e.AsCall()
			switch args := c.Args(); c.FunctionName() {
			case operators.Index:
				if name, ok := constString(args[1]); ok && isArgs(args[0]) && !declared(name) {
					return undeclared(args[0], fmt.Sprintf("args[%q]", name), name)
				}
			case operators.In:
				if name, ok := constString(args[0]); ok && isArgs(args[1]) && !declared(name) {
					return undeclared(args[0], fmt.Sprintf("%q in args", name), name)
				}
			case operators.Add, operators.Subtract, operators.Multiply, operators.Divide, operators.Modulo:
				kinds := []types.Kind{a.GetType(args[0].ID()).Kind(), a.GetType(args[1].ID()).Kind()}
				integer := slices.Contains(kinds, types.IntKind) || slices.Contains(kinds, types.UintKind)
				if integer && slices.Contains(kinds, types.DynKind) {
					return at(e, "the numbers in args are doubles, and CEL does no arithmetic between a double and an integer: write 2.0 for 2, double(size(…)) or int(args.…)")
				}
			}
		}
	}
	return nil
}

// parseApproval reads a tool's approval: the scalar required, or a mapping
// of when, ttl and group. Errors are *DefinitionError values naming tool
// and the field.
func parseApproval(tool string, n *yaml.Node) (*Approval, error) {
	bad := func(field, format string, args ...any) error {
		return &DefinitionError{Tool: tool, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case n.Kind == yaml.ScalarNode && n.Tag == "!!str" && n.Value == "required":
		return &Approval{}, nil
	case n.Kind != yaml.MappingNode:
		return nil, bad("approval", "want required, or a mapping of when, ttl and group (line %d)", n.Line)
	}
	known := []string{"when", "ttl", "group"}
	for i := 0; i < len(n.Content); i += 2 {
		if k := n.Content[i]; !slices.Contains(known, k.Value) {
			msg := fmt.Sprintf("line %d: unknown field %q", k.Line, k.Value)
			if best := closest(k.Value, known); best != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", best)
			} else {
				msg += " (known: " + strings.Join(known, ", ") + ")"
			}
			return nil, bad("approval", "%s", msg)
		}
	}
	var s struct {
		When  string `yaml:"when"`
		TTL   string `yaml:"ttl"`
		Group string `yaml:"group"`
	}
	if err := n.Decode(&s); err != nil {
		return nil, bad("approval", "%s", oneLine(err.Error()))
	}
	ttl, err := parseRetention(s.TTL)
	if err != nil {
		return nil, bad("approval.ttl", "%q is not a positive duration (e.g. 2h, 7d)", s.TTL)
	}
	return &Approval{When: s.When, TTL: ttl, Group: s.Group}, nil
}
