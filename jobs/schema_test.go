package jobs_test

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolq/toolq/jobs"
)

// schema compiles one of docs/schema, the JSON Schemas of the wire format
// that other languages' clients validate against.
func schema(t *testing.T, name string) *jsonschema.Schema {
	t.Helper()
	data, err := os.ReadFile("../docs/schema/" + name)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource(name, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func validates(s *jsonschema.Schema, body []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return err
	}
	return s.Validate(v)
}

// TestJobSchemaIsTheDecoder: docs/schema/job.v1.json takes what DecodeJob
// takes and refuses what it refuses for its fields (the strict parse of the
// args is beyond a schema).
func TestJobSchemaIsTheDecoder(t *testing.T) {
	t.Parallel()
	s := schema(t, "job.v1.json")
	valid := `{"version":1,"conversation_id":"c-42","turn_index":7,"ordinal":0,"tool":"send_payment","tool_use_id":"toolu_01A",` +
		`"args":{"invoice_id":"inv_9"},"created_at":"2026-12-02T10:00:00Z"}`
	for name, body := range map[string]string{
		"valid":             valid,
		"no ordinal":        strings.Replace(valid, `"ordinal":0,`, "", 1),
		"no created_at":     strings.Replace(valid, `,"created_at":"2026-12-02T10:00:00Z"`, "", 1),
		"version 2":         strings.Replace(valid, `"version":1`, `"version":2`, 1),
		"an unknown field":  strings.Replace(valid, `"version":1`, `"version":1,"priority":3`, 1),
		"a conversation |":  strings.Replace(valid, `"c-42"`, `"c|42"`, 1),
		"a tool with a dot": strings.Replace(valid, `"send_payment"`, `"send.payment"`, 1),
		"a negative turn":   strings.Replace(valid, `"turn_index":7`, `"turn_index":-1`, 1),
		"args an array":     strings.Replace(valid, `{"invoice_id":"inv_9"}`, `[1]`, 1),
		"no tool_use_id":    strings.Replace(valid, `"tool_use_id":"toolu_01A",`, "", 1),
		"a bad created_at":  strings.Replace(valid, `2026-12-02T10:00:00Z`, `yesterday`, 1),
		"a tenant":          strings.Replace(valid, `"version":1`, `"version":1,"tenant":"acme"`, 1),
		"an empty tenant":   strings.Replace(valid, `"version":1`, `"version":1,"tenant":""`, 1),
		"a reserved tenant": strings.Replace(valid, `"version":1`, `"version":1,"tenant":"results"`, 1),
		"a tenant with a .": strings.Replace(valid, `"version":1`, `"version":1,"tenant":"a.b"`, 1),
	} {
		_, decErr := jobs.DecodeJob([]byte(body))
		schemaErr := validates(s, []byte(body))
		if (decErr == nil) != (schemaErr == nil) {
			t.Errorf("%s: DecodeJob says %v, the schema %v", name, decErr, schemaErr)
		}
	}
}

// TestResultSchemaTakesEveryResult: every kind of result the worker writes
// validates against docs/schema/result.v1.json.
func TestResultSchemaTakesEveryResult(t *testing.T) {
	t.Parallel()
	s := schema(t, "result.v1.json")
	j := &jobs.Job{Version: 1, ConversationID: "c-42", TurnIndex: 7, Tool: "send_payment", ToolUseID: "toolu_01B", Args: json.RawMessage(`{}`)}
	key, _ := j.Key()
	ok := jobs.NewResult(j, key, jobs.StatusOK)
	ok.Output, ok.Attempts = json.RawMessage(`{"id":"pay_1"}`), 1
	dup := jobs.NewResult(j, key, jobs.StatusOK)
	dup.Output, dup.Duplicate, dup.OriginalToolUseID, dup.Attempts = json.RawMessage(`null`), true, "toolu_01A", 1
	failed := jobs.NewResult(j, key, jobs.StatusError)
	failed.Error, failed.Attempts = &jobs.ResultError{Code: "http_402", Message: "card declined"}, 2
	rejected := jobs.NewResult(j, key, jobs.StatusRejected)
	rejected.Error = &jobs.ResultError{Code: "unknown_tool", Message: "no tool"}
	unknown := jobs.NewResult(j, key, jobs.StatusIndeterminate)
	unknown.Error, unknown.Attempts = &jobs.ResultError{Code: "holder_lost", Message: "stopped"}, 1
	asked := &jobs.ResultApproval{Args: json.RawMessage(`{"amount_cents":90000}`), ArgsDigest: "5f1d", Group: "finance",
		RequestedAt: time.Now().UTC(), ExpiresAt: time.Now().UTC().Add(time.Hour)}
	pending := jobs.NewResult(j, key, jobs.StatusAwaitingApproval)
	pending.Approval, pending.Attempts = asked, 1
	decided := *asked
	decided.Decision, decided.DecidedBy, decided.Reason, decided.DecidedAt = "denied", "alice", "over budget", time.Now().UTC()
	denied := jobs.NewResult(j, key, jobs.StatusDenied)
	denied.Approval, denied.Error = &decided, &jobs.ResultError{Code: "approval_denied", Message: "denied by alice: over budget"}
	expired := jobs.NewResult(j, key, jobs.StatusExpired)
	expired.Approval, expired.Error = asked, &jobs.ResultError{Code: "approval_expired", Message: "no decision before the approval expired"}
	tj := *j
	tj.Tenant = "acme"
	tenants := jobs.NewResult(&tj, key, jobs.StatusOK)
	tenants.Output, tenants.Attempts = json.RawMessage(`{"id":"pay_2"}`), 1
	for _, r := range []*jobs.Result{ok, dup, failed, rejected, unknown, pending, denied, expired, tenants} {
		body, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := validates(s, body); err != nil {
			t.Errorf("%s: %v\n%s", r.Status, err, body)
		}
	}
	bad := strings.Replace(mustJSON(t, failed), `"error":{`, `"nothing":{`, 1)
	if validates(s, []byte(bad)) == nil {
		t.Error("a result with an unknown field validates")
	}
	pending.Approval = nil
	if validates(s, []byte(mustJSON(t, pending))) == nil {
		t.Error("a result awaiting approval without its approval validates")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestArgsThatHaveAKeyFitInAJobBody: args nested as deep as a key allows
// (jcs.MaxDepth) are taken inside a job body, one level deeper; one more
// level has no key and is refused either way. (The body was held to the
// args' limit: args with a key made a job no consumer took, and its agent
// waited for ever.)
func TestArgsThatHaveAKeyFitInAJobBody(t *testing.T) {
	t.Parallel()
	for depth, ok := range map[int]bool{64: true, 65: false} {
		args := strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1)
		args = `{"a":` + args + `}`
		j := &jobs.Job{Version: 1, ConversationID: "c", TurnIndex: 1, Tool: "t", ToolUseID: "toolu_1", Args: json.RawMessage(args)}
		_, keyErr := j.Key()
		body, _ := json.Marshal(j)
		_, decErr := jobs.DecodeJob(body)
		if (keyErr == nil) != ok || (decErr == nil) != ok {
			t.Errorf("args %d deep: key %v, body %v; want both %v", depth, keyErr, decErr, ok)
		}
	}
}
