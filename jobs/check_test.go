package jobs

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestConversationCheck: the record check finds each way a turn can be
// wrong on the record.
func TestConversationCheck(t *testing.T) {
	t.Parallel()
	use := func(id string) ToolCall {
		return ToolCall{ToolUseID: id, Tool: "send_payment", Args: json.RawMessage(`{}`)}
	}
	ran := func(id string) ToolResult {
		return (&Result{ToolUseID: id, Status: StatusOK, Output: json.RawMessage(`{"id":"pay_1"}`)}).ToolResult()
	}
	for _, tc := range []struct {
		name string
		turn CommittedTurn
		want string // empty: the record holds
	}{
		{"one result per use", CommittedTurn{ToolUses: []ToolCall{use("a"), use("b")}, ToolResults: []ToolResult{ran("a"), notRunResult("b")}}, ""},
		{"a result missing", CommittedTurn{ToolUses: []ToolCall{use("a"), use("b")}, ToolResults: []ToolResult{ran("a")}}, "2 tool_use and 1 tool_result"},
		{"results swapped", CommittedTurn{ToolUses: []ToolCall{use("a"), use("b")}, ToolResults: []ToolResult{ran("b"), ran("a")}}, "tool_result for b where a was used"},
		{"a use twice", CommittedTurn{ToolUses: []ToolCall{use("a"), use("a")}, ToolResults: []ToolResult{ran("a"), ran("a")}}, "tool_use a twice"},
		{"a fabricated result", CommittedTurn{ToolUses: []ToolCall{use("a")}, ToolResults: []ToolResult{{ToolUseID: "a", Content: json.RawMessage(`{"id":"pay_1"}`)}}}, "a result toolq never sent"},
		{"a result of an abandoned attempt", CommittedTurn{ToolUses: []ToolCall{use("old")}, ToolResults: []ToolResult{ran("old")}}, "of an abandoned attempt"},
	} {
		c := &Conversation{ID: "c", turns: []*CommittedTurn{&tc.turn}, abandoned: map[string]bool{"old": true}}
		err := c.Check()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}
