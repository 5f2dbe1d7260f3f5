package jobs_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/toolq/toolq/jobs"
)

// The default tenant is a single-tenant deployment as it was before
// tenants: the keys of the vectors written before them, from a body with no
// tenant or an empty one, and today's subjects and streams, byte for byte.
func TestDefaultTenantKeysAndSubjectsAreUnchanged(t *testing.T) {
	t.Parallel()
	type vector struct {
		ConversationID string `json:"conversation_id"`
		TurnIndex      int64  `json:"turn_index"`
		Tool           string `json:"tool"`
		Ordinal        int64  `json:"ordinal"`
		ArgsWire       string `json:"args_wire"`
		Material       string `json:"material"`
		Key            string `json:"key"`
	}
	for i, v := range readJSONL[vector](t, "testdata/python_keys.jsonl") {
		for _, tenant := range []string{``, `"tenant":"",`} {
			body := fmt.Sprintf(`{"version":1,%s"conversation_id":%q,"turn_index":%d,"tool":%q,"ordinal":%d,"tool_use_id":"toolu_%d","args":%s}`,
				tenant, v.ConversationID, v.TurnIndex, v.Tool, v.Ordinal, i, v.ArgsWire)
			j, m, err := jobs.DecodeJobMaterial([]byte(body))
			if err != nil {
				t.Fatalf("row %d (%s): %v", i, tenant, err)
			}
			if j.Tenant != "" || m.Text != v.Material || m.Key() != v.Key {
				t.Fatalf("row %d (%s): tenant %q, key %s, want the vector's %s", i, tenant, j.Tenant, m.Key(), v.Key)
			}
		}
	}
	// A key from before tenants, pinned as a literal.
	key, err := jobs.Call{ConversationID: "conv-1", TurnIndex: 3, Tool: "send_payment", Args: []byte(`{"currency":"EUR","amount":1}`)}.Key()
	if err != nil {
		t.Fatal(err)
	}
	if key != "ab2f01b88ac510ba073855c5f886b155" {
		t.Errorf("default tenant key %s, want ab2f01b88ac510ba073855c5f886b155", key)
	}
	for _, c := range [][2]string{
		{jobs.TenantJobSubject("", "send_payment"), "toolq.jobs.send_payment"},
		{jobs.TenantResultSubject("", "conv-1"), "toolq.results.conv-1"},
		{jobs.TenantDLQSubject("", jobs.DLQInvalid), "toolq.dlq.invalid"},
		{jobs.TenantApprovalSubject("", "conv-1"), "toolq.approvals.conv-1"},
		{jobs.TenantDecideSubject("", "finance"), "toolq.decide.finance"},
		{jobs.TenantLookupSubject(""), "toolq.ledger.get"},
		{jobs.TenantJobsPrefix("") + ">", "toolq.jobs.>"},
		{jobs.TenantStream("", jobs.ResultsStream), "TOOLQ_RESULTS"},
		{jobs.TenantStream("", jobs.DLQStream), "TOOLQ_DLQ"},
		{jobs.TenantStream("", jobs.ApprovalsStream), "TOOLQ_APPROVALS"},
		{jobs.JobSubject("send_payment"), "toolq.jobs.send_payment"},
		{jobs.ResultSubject("conv-1"), "toolq.results.conv-1"},
		{jobs.LookupSubject, "toolq.ledger.get"},
	} {
		if c[0] != c[1] {
			t.Errorf("%s, want %s", c[0], c[1])
		}
	}
}

// A tenant's key is hashed from "tenant|" and the default tenant's
// material, so that two tenants' identical calls have two keys; its
// subjects and streams are its own.
func TestTenantKeyAndSubjectsCarryTheTenant(t *testing.T) {
	t.Parallel()
	call := jobs.Call{Tenant: "acme", ConversationID: "conv-1", TurnIndex: 3, Tool: "send_payment", Args: []byte(`{"currency":"EUR","amount":1}`)}
	m, err := call.Material()
	if err != nil {
		t.Fatal(err)
	}
	if m.Text != `acme|conv-1|3|send_payment|0|{"amount":1,"currency":"EUR"}` || m.Key() != "b838ba7140c66d071dd2e52a36af10b4" {
		t.Errorf("material %q key %s", m.Text, m.Key())
	}
	body := `{"version":1,"tenant":"acme","conversation_id":"conv-1","turn_index":3,"tool":"send_payment","tool_use_id":"t1","args":{"amount":1,"currency":"EUR"}}`
	j, dm, err := jobs.DecodeJobMaterial([]byte(body))
	if err != nil || j.Tenant != "acme" || dm.Key() != m.Key() {
		t.Fatalf("decoded tenant %q key %s, %v", j.Tenant, dm.Key(), err)
	}
	if r := jobs.NewResult(j, dm.Key(), jobs.StatusOK); r.Tenant != "acme" {
		t.Errorf("result tenant %q", r.Tenant)
	}
	for _, c := range [][2]string{
		{jobs.TenantJobSubject("acme", "send_payment"), "toolq.acme.jobs.send_payment"},
		{jobs.TenantResultSubject("acme", "conv-1"), "toolq.acme.results.conv-1"},
		{jobs.TenantDLQSubject("acme", jobs.DLQInvalid), "toolq.acme.dlq.invalid"},
		{jobs.TenantApprovalSubject("acme", "conv-1"), "toolq.acme.approvals.conv-1"},
		{jobs.TenantDecideSubject("acme", "finance"), "toolq.acme.decide.finance"},
		{jobs.TenantLookupSubject("acme"), "toolq.acme.ledger.get"},
		{jobs.TenantStream("acme", jobs.ResultsStream), "TOOLQ_acme_RESULTS"},
		{jobs.TenantStream("acme", jobs.DLQStream), "TOOLQ_acme_DLQ"},
		{jobs.TenantStream("acme", jobs.ApprovalsStream), "TOOLQ_acme_APPROVALS"},
	} {
		if c[0] != c[1] {
			t.Errorf("%s, want %s", c[0], c[1])
		}
	}
}

// A tenant is one subject token, and never the second token of a default
// subject, so that toolq.<tenant>.> overlaps no other tenant's subjects.
func TestTenantNamesThatWouldOverlapAreRefused(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"jobs", "results", "dlq", "approvals", "decide", "ledger", "tools", "a.b", "*", ">", "a b", "a|b",
		strings.Repeat("x", 65)} {
		body := fmt.Sprintf(`{"version":1,"tenant":%q,"conversation_id":"c","turn_index":0,"tool":"t","tool_use_id":"u","args":{}}`, bad)
		_, err := jobs.DecodeJob([]byte(body))
		var fe *jobs.FieldError
		if !errors.As(err, &fe) || fe.Field != "tenant" || jobs.ValidTenant(bad) {
			t.Errorf("tenant %q: %v", bad, err)
		}
	}
	for _, good := range []string{"", "acme", "A_b-9", strings.Repeat("x", 64)} {
		if !jobs.ValidTenant(good) {
			t.Errorf("tenant %q refused", good)
		}
	}
	for subject, want := range map[string]string{"toolq.jobs.send": "", "toolq.acme.jobs.send": "acme", "toolq.jobs.jobs": "",
		"toolq.jobs.a.b": "", "toolq.acme.jobs.pay.extra": "acme", "toolq.jobs.acme.jobs.x": ""} {
		if got, ok := jobs.SubjectTenant(subject); !ok || got != want {
			t.Errorf("SubjectTenant(%s) = %q, %v", subject, got, ok)
		}
	}
	for _, subject := range []string{"toolq.results.c", "toolq.dlq.acme.jobs", "other.jobs.x", "toolq.acme.results.x", "toolq.jobs.", "toolq.acme.jobs.", "toolq.a.b.jobs.x", "toolq.results.jobs.x"} {
		if got, ok := jobs.SubjectTenant(subject); ok {
			t.Errorf("SubjectTenant(%s) = %q, true", subject, got)
		}
	}
}
