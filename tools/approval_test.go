package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/tools"
)

// approvalRegistry parses a registry of one keyed_write tool, pay, whose
// schema declares amount_cents, order, items, note and x, with the
// approval (and other) lines given.
func approvalRegistry(lines string) (*tools.Registry, error) {
	file := `tools:
  - name: pay
    class: keyed_write
    schema:
      type: object
      properties:
        amount_cents: {type: number}
        order: {type: object}
        items: {type: array}
        note: {type: string}
        x: {type: integer}
    builtin: echo
` + lines
	echo := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) { return r.Args, nil })
	return tools.Parse([]byte(file), "tools.yaml", tools.Config{Builtins: map[string]tools.Executor{"echo": echo}})
}

func approvalOf(t *testing.T, lines string) *tools.Approval {
	t.Helper()
	reg, err := approvalRegistry(lines)
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	return tool.Approval
}

func TestApprovalRequiredNeedsEveryCallWithTheDefaults(t *testing.T) {
	t.Parallel()
	a := approvalOf(t, "    approval: required\n")
	if a == nil || a.When != "" || a.TTL != 24*time.Hour || a.Group != "approvers" {
		t.Fatalf("approval: %+v", a)
	}
	for _, args := range []string{`{}`, `{"amount_cents":1}`} {
		if needed, err := a.Needed(json.RawMessage(args)); !needed || err != nil {
			t.Errorf("%s: needed %v, %v", args, needed, err)
		}
	}
}

func TestApprovalAbsentNeedsNone(t *testing.T) {
	t.Parallel()
	a := approvalOf(t, "")
	if a != nil {
		t.Fatalf("approval: %+v", a)
	}
	if needed, err := a.Needed(json.RawMessage(`{}`)); needed || err != nil {
		t.Fatalf("needed %v, %v", needed, err)
	}
}

func TestApprovalTTLAndGroupAreTheToolsOwn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lines string
		ttl   time.Duration
		group string
	}{
		{"    approval: {when: args.x > 1}\n", 24 * time.Hour, "approvers"},
		{"    approval: {ttl: 2h, group: finance}\n", 2 * time.Hour, "finance"},
		{"    approval: {ttl: 30d, group: Ops-2_eu}\n", 30 * 24 * time.Hour, "Ops-2_eu"},
		{"    approval: {ttl: 1d12h}\n", 36 * time.Hour, "approvers"},
	} {
		a := approvalOf(t, tc.lines)
		if a.TTL != tc.ttl || a.Group != tc.group {
			t.Errorf("%s: ttl %s, group %q", strings.TrimSpace(tc.lines), a.TTL, a.Group)
		}
	}
}

func TestApprovalWhenDecidesByTheArgs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		when, args string
		want       bool
	}{
		{"args.amount_cents > 50000", `{"amount_cents":50001}`, true},
		{"args.amount_cents > 50000", `{"amount_cents":50000}`, false},
		{"args.amount_cents > 50000", `{"amount_cents":50000.5}`, true},
		{"args.amount_cents > 500.5", `{"amount_cents":501}`, true},
		{"args.amount_cents > 500.5", `{"amount_cents":500}`, false},
		{"args.amount_cents == 60000", `{"amount_cents":60000}`, true},
		{"args.amount_cents in [1, 2, 3]", `{"amount_cents":2}`, true},
		{"args.amount_cents * 2.0 > 100.0", `{"amount_cents":51}`, true},
		{"int(args.amount_cents) % 2 == 0", `{"amount_cents":51}`, false},
		{"args.order.total > 10", `{"order":{"total":11}}`, true},
		{"args.order.total > 10", `{"order":{"total":10}}`, false},
		{"has(args.note)", `{"note":"urgent"}`, true},
		{"has(args.note)", `{}`, false},
		{"has(args.order.total) && args.order.total > 10", `{"order":{}}`, false},
		{"size(args.items) > 3", `{"items":[1,2,3,4]}`, true},
		{"size(args.items) > 3", `{"items":[1,2,3]}`, false},
		{"args.items.exists(i, i.sku == 'gold')", `{"items":[{"sku":"tin"},{"sku":"gold"}]}`, true},
		{`args["note"].contains("refund")`, `{"note":"a refund"}`, true},
		{`"note" in args`, `{"x":1}`, false},
		{"args.note", `{"note":true}`, true},
		// within the cost limit
		{"args.items.exists(i, i == 5)", `{"items":[` + strings.Repeat("1,", 2999) + `1]}`, false},
	} {
		a := approvalOf(t, fmt.Sprintf("    approval: {when: %q}\n", tc.when))
		needed, err := a.Needed(json.RawMessage(tc.args))
		if needed != tc.want || err != nil {
			t.Errorf("%s over %s: needed %v, %v; want %v", tc.when, tc.args[:min(len(tc.args), 40)], needed, err, tc.want)
		}
	}
}

func TestApprovalConditionThatCannotBeEvaluatedNeedsApprovalAndSaysWhy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		when, args, why string
	}{
		{"args.amount_cents > 50000", `{}`, "no such key: amount_cents"},
		{"args.amount_cents > 50000", `{"amount_cents":"lots"}`, "no such overload"},
		{"args.note", `{"note":"yes"}`, "not a condition (bool)"},
		{"args.amount_cents > 1", `[1]`, "not a JSON object"},
		// 3000² comparisons: more than the cost limit allows.
		{"args.items.all(a, args.items.all(b, a == b || a != b))", `{"items":[` + strings.Repeat("1,", 2999) + `1]}`, "cost limit"},
	} {
		a := approvalOf(t, fmt.Sprintf("    approval: {when: %q}\n", tc.when))
		needed, err := a.Needed(json.RawMessage(tc.args))
		if !needed || err == nil || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s over %.40s: needed %v, %v; want true and %q", tc.when, tc.args, needed, err, tc.why)
		}
	}
}

func TestApprovalLoadErrorsNameToolFieldAndWhy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, lines string
		field       string
		want        []string
	}{
		{"bad syntax", "    approval:\n      when: |\n        args.x > 1 &&\n        args.x <\n", "approval.when", []string{"3:1: Syntax error"}},
		{"undeclared variable", "    approval: {when: amount_cents > 1}\n", "approval.when", []string{"1:1:", "undeclared reference to 'amount_cents'"}},
		{"not a condition", "    approval: {when: size(args.items)}\n", "approval.when", []string{"must be a condition (bool), is int"}},
		{"a string", `    approval: {when: "'yes'"}` + "\n", "approval.when", []string{"must be a condition (bool), is string"}},
		{"undeclared property", "    approval: {when: args.amout_cents > 50000}\n", "approval.when",
			[]string{"1:1: args.amout_cents: the schema declares no property amout_cents", `did you mean "amount_cents"`}},
		{"undeclared property in has", "    approval: {when: has(args.nots)}\n", "approval.when", []string{"1:5: args.nots: the schema declares no property nots"}},
		{"undeclared property by index", `    approval: {when: "args['amout_cents'] > 1"}` + "\n", "approval.when", []string{`args["amout_cents"]: the schema declares no property amout_cents`}},
		{"undeclared property in in", `    approval: {when: "'nots' in args"}` + "\n", "approval.when", []string{`"nots" in args: the schema declares no property nots`}},
		{"integer arithmetic on a double", "    approval: {when: args.amount_cents * 2 > 100}\n", "approval.when", []string{"1:19:", "write 2.0"}},
		{"iteration variable hides args", "    approval: {when: 'args.items.exists(args, args > 1)'}\n", "approval.when", []string{"hides the call's args"}},
		{"group with a dot", "    approval: {group: fin.ance}\n", "approval.group", []string{`"fin.ance"`, "NATS subject token"}},
		{"group too long", "    approval: {group: " + strings.Repeat("g", 65) + "}\n", "approval.group", []string{"must match"}},
		{"ttl above 30 days", "    approval: {ttl: 31d}\n", "approval.ttl", []string{"at most 30d"}},
		{"ttl not a duration", "    approval: {ttl: soon}\n", "approval.ttl", []string{`"soon" is not a positive duration`}},
		{"ttl zero", "    approval: {ttl: 0s}\n", "approval.ttl", []string{`"0s" is not a positive duration`}},
		{"another scalar", "    approval: optional\n", "approval", []string{"want required, or a mapping"}},
		{"null", "    approval:\n", "approval", []string{"want required, or a mapping"}},
		{"unknown key", "    approval: {gruop: finance}\n", "approval", []string{`unknown field "gruop"`, `did you mean "group"`}},
		{"keyed write without ledger", "    ledger: false\n    approval: required\n", "approval", []string{"needs the ledger", "ledger: false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := approvalRegistry(tc.lines)
			var de *tools.DefinitionError
			if !errors.As(err, &de) {
				t.Fatalf("want a *DefinitionError, got %v", err)
			}
			if de.Tool != "pay" || de.Field != tc.field || de.File != "tools.yaml" {
				t.Errorf("tool %q field %q file %q; want pay, %s, tools.yaml", de.Tool, de.Field, de.File, tc.field)
			}
			for _, w := range tc.want {
				if !strings.Contains(de.Msg, w) {
					t.Errorf("%q does not say %q", de.Msg, w)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

func TestApprovalIsRefusedOnAReadTool(t *testing.T) {
	t.Parallel()
	_, err := tools.Parse([]byte(`tools:
  - name: look
    class: read
    schema: {type: object}
    builtin: echo
    approval: required
`), "tools.yaml", tools.Config{Builtins: map[string]tools.Executor{"echo": tools.ExecutorFunc(nil)}})
	var de *tools.DefinitionError
	if !errors.As(err, &de) || de.Tool != "look" || de.Field != "approval" || !strings.Contains(de.Msg, "without a ledger claim") {
		t.Fatalf("got %v", err)
	}
}

func TestApprovalWithoutSchemaPropertiesTakesAnyMember(t *testing.T) {
	t.Parallel()
	reg, err := tools.NewRegistry([]tools.Definition{{
		Name: "pay", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(nil), Approval: &tools.Approval{When: `args.anything == "x"`},
	}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	if needed, err := tool.Approval.Needed(json.RawMessage(`{"anything":"x"}`)); !needed || err != nil {
		t.Fatalf("needed %v, %v", needed, err)
	}
}

func TestApprovalOfAGoDefinitionIsCompiledByNewRegistry(t *testing.T) {
	t.Parallel()
	given := &tools.Approval{When: "args.amount_cents > 50000", Group: "finance"}
	def := tools.Definition{
		Name: "pay", Class: tools.KeyedWrite, Executor: tools.ExecutorFunc(nil), Approval: given,
		Schema: json.RawMessage(`{"type":"object","properties":{"amount_cents":{"type":"integer"}}}`),
	}
	reg, err := tools.NewRegistry([]tools.Definition{def}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	a := tool.Approval
	if a.TTL != tools.DefaultApprovalTTL || a.Group != "finance" || a.When != given.When {
		t.Fatalf("approval: %+v", a)
	}
	if needed, err := a.Needed(json.RawMessage(`{"amount_cents":50001}`)); !needed || err != nil {
		t.Errorf("above: needed %v, %v", needed, err)
	}
	if needed, err := a.Needed(json.RawMessage(`{"amount_cents":1}`)); needed || err != nil {
		t.Errorf("below: needed %v, %v", needed, err)
	}
	// The caller's Approval is left as given; one not built by NewRegistry
	// cannot tell, and asks.
	if given.TTL != 0 {
		t.Errorf("the definition's approval was changed: %+v", given)
	}
	if needed, err := given.Needed(json.RawMessage(`{"amount_cents":1}`)); !needed || err == nil {
		t.Errorf("uncompiled: needed %v, %v", needed, err)
	}

	def.Approval = &tools.Approval{When: "args.amount_cents >"}
	_, err = tools.NewRegistry([]tools.Definition{def}, tools.Config{})
	var de *tools.DefinitionError
	if !errors.As(err, &de) || de.Tool != "pay" || de.Field != "approval.when" || !strings.Contains(de.Msg, "1:20: Syntax error") {
		t.Fatalf("bad condition: %v", err)
	}
	def.Approval = &tools.Approval{TTL: -time.Second}
	if _, err = tools.NewRegistry([]tools.Definition{def}, tools.Config{}); !errors.As(err, &de) || de.Field != "approval.ttl" {
		t.Fatalf("negative ttl: %v", err)
	}
}
