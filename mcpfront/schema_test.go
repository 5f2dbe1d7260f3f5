package mcpfront_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	"github.com/toolq/toolq/mcpfront"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestASchemaTheSDKRefusesLeavesTheToolOutInsteadOfPanicking: the MCP SDK
// panics on a schema whose x-mcp-header annotation it refuses (only
// string, integer and boolean properties bind to a header), which the
// registry takes (an unknown keyword for JSON Schema); the front door
// leaves that tool out with a warning and serves the others, as it does
// for a schema that is not for an object.
func TestASchemaTheSDKRefusesLeavesTheToolOutInsteadOfPanicking(t *testing.T) {
	t.Parallel()
	exec := tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })
	reg, err := tools.NewRegistry([]tools.Definition{
		{Name: "lookup", Class: tools.Read, Executor: exec,
			Schema: json.RawMessage(`{"type":"object","properties":{"region":{"type":"object","x-mcp-header":"Region"}}}`)},
		{Name: "ping", Class: tools.Read, Executor: exec, Schema: json.RawMessage(`{"type":"object"}`)},
	}, tools.Config{})
	if err != nil {
		t.Fatalf("the registry refuses the schema: %v", err)
	}
	st, _ := noteStack(t, worker.Config{})
	var front *mcpfront.Server
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("mcpfront.New panicked on a schema the registry took: %v", p)
			}
		}()
		front, err = mcpfront.New(mcpfront.Config{Registry: reg, JS: st.JS, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(front.Close)
	cs := connect(t, serveFront(t, front))
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Tools) != 1 || list.Tools[0].Name != "ping" {
		t.Fatalf("want ping alone, got %+v", list.Tools)
	}
}
