package jobs

import (
	"encoding/json"
	"testing"
)

// TestDecodedJobDoesNotAliasTheBody: overwriting the message buffer after the decode
// changes neither the job nor its material.
func TestDecodedJobDoesNotAliasTheBody(t *testing.T) {
	body := []byte(`{"version":1,"conversation_id":"conv","turn_index":3,"tool":"tool","tool_use_id":"tuid","args":{"a":"bcd"},"created_at":"2026-01-02T03:04:05Z"}`)
	j, m, err := DecodeJobMaterial(body)
	if err != nil {
		t.Fatal(err)
	}
	c, err := DecodeCall(body)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := json.Marshal(j)
	text, canon, cargs := m.Text, string(m.Canonical), string(c.Args)
	for i := range body {
		body[i] = 'X'
	}
	after, _ := json.Marshal(j)
	if string(before) != string(after) || m.Text != text || string(m.Canonical) != canon || string(c.Args) != cargs || c.ConversationID != "conv" {
		t.Fatalf("the decoded job aliases the body: %s / %s, material %q", before, after, m.Text)
	}
}
