package tools_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolq/toolq/demo"
	"github.com/toolq/toolq/tools"
)

// formatSchema compiles testdata/export/<format>.schema.json: the shape of
// one format's tool definitions, written from the API's own definition (see
// each file's $comment).
func formatSchema(t *testing.T, f tools.Format) *jsonschema.Schema {
	t.Helper()
	path := filepath.Join("testdata", "export", string(f)+".schema.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(path, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// everyClass is a registry with a tool of each class there is, one without
// a description, and one whose schema has no top-level type.
func everyClass(t *testing.T) *tools.Registry {
	t.Helper()
	exec := tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })
	schema := json.RawMessage(`{"type":"object","properties":{"id":{"type":"string"}},"required":["id"],"additionalProperties":false}`)
	var defs []tools.Definition
	// transactional_write joins the list once the registry knows it.
	for _, c := range []tools.Class{tools.Read, tools.KeyedWrite, tools.UnkeyedWrite, "transactional_write"} {
		if !c.Valid() {
			t.Logf("class %s is not one the registry takes: not exported", c)
			continue
		}
		d := tools.Definition{Name: "a_" + string(c), Description: "A tool of class " + string(c) + ".", Class: c, Schema: schema, Executor: exec}
		if c == "transactional_write" { // runs in the ledger's transaction: a TxExecutor
			d.Executor, d.TxExecutor = nil, txNothing
		}
		defs = append(defs, d)
	}
	defs = append(defs,
		tools.Definition{Name: "no_description", Class: tools.Read, Schema: schema, Executor: exec},
		tools.Definition{Name: "untyped", Description: "Takes <n>, an integer & nothing else; its schema says no type.", Class: tools.KeyedWrite,
			Schema: json.RawMessage(` {"properties": {"n": {"type": "integer"}}} `), Executor: exec},
		tools.Definition{Name: "empty_schema", Description: "Takes any object.", Class: tools.Read, Schema: json.RawMessage(`{ }`), Executor: exec},
	)
	reg, err := tools.NewRegistry(defs, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestExportValidatesAgainstEachFormatsSchema: the demo registry and one
// with every class, exported in each format, are what that API takes; the
// MCP export also reads as the Go MCP SDK's Tool.
func TestExportValidatesAgainstEachFormatsSchema(t *testing.T) {
	t.Parallel()
	demoReg, err := demo.Registry("http://127.0.0.1:1", tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for name, reg := range map[string]*tools.Registry{"demo": demoReg, "every class": everyClass(t)} {
		for _, f := range tools.Formats {
			out, err := reg.Export(f)
			if err != nil {
				t.Fatalf("%s %s: %v", name, f, err)
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(out))
			if err != nil {
				t.Fatalf("%s %s: %v", name, f, err)
			}
			if err := formatSchema(t, f).Validate(doc); err != nil {
				t.Errorf("%s %s: %v\n%s", name, f, err, out)
			}
			if n := len(doc.([]any)); n != len(reg.Tools()) {
				t.Errorf("%s %s: %d tools, want %d", name, f, n, len(reg.Tools()))
			}
		}
		out, err := reg.Export(tools.FormatMCP)
		if err != nil {
			t.Fatal(err)
		}
		var listed []*mcp.Tool
		if err := json.Unmarshal(out, &listed); err != nil {
			t.Fatalf("%s: as mcp.Tool: %v", name, err)
		}
		for i, tool := range reg.Tools() {
			if listed[i].Name != tool.Name || listed[i].Annotations == nil || listed[i].Annotations.ReadOnlyHint != (tool.Class == tools.Read) {
				t.Errorf("%s: mcp tool %d: %+v, want %s (%s)", name, i, listed[i], tool.Name, tool.Class)
			}
		}
	}
}

// TestExportWritesEachToolOnce: every format carries each tool's name,
// description and schema as the registry has them, in name order, so that
// the model's definitions and toolq's cannot differ; text as written, not
// HTML-escaped.
func TestExportWritesEachToolOnce(t *testing.T) {
	t.Parallel()
	reg := everyClass(t)
	fields := map[tools.Format]func(m map[string]any) (name, desc, schema any){
		tools.FormatAnthropic: func(m map[string]any) (any, any, any) { return m["name"], m["description"], m["input_schema"] },
		tools.FormatOpenAI: func(m map[string]any) (any, any, any) {
			fn := m["function"].(map[string]any)
			return fn["name"], fn["description"], fn["parameters"]
		},
		tools.FormatOpenAIResponses: func(m map[string]any) (any, any, any) { return m["name"], m["description"], m["parameters"] },
		tools.FormatMCP:             func(m map[string]any) (any, any, any) { return m["name"], m["description"], m["inputSchema"] },
	}
	for _, f := range tools.Formats {
		out, err := reg.Export(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(out, []byte("<n>, an integer & nothing else")) {
			t.Errorf("%s: a description is not as written: %s", f, out)
		}
		var got []map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		for i, tool := range reg.Tools() {
			name, desc, schema := fields[f](got[i])
			var want map[string]any
			if err := json.Unmarshal(tool.SchemaJSON, &want); err != nil {
				t.Fatal(err)
			}
			want["type"] = "object" // added where the schema has none
			var wantDesc any
			if tool.Description != "" {
				wantDesc = tool.Description
			}
			if name != tool.Name || desc != wantDesc || !reflect.DeepEqual(schema, any(want)) {
				t.Errorf("%s %d: %v %q %v, want %s %q %v", f, i, name, desc, schema, tool.Name, tool.Description, want)
			}
		}
	}
}

// TestExportAddsTheObjectTypeASchemaLeavesOut: a schema without a
// top-level type gets "type": "object" first, the rest as written; a
// schema that says object is written byte for byte.
func TestExportAddsTheObjectTypeASchemaLeavesOut(t *testing.T) {
	t.Parallel()
	out, err := everyClass(t).Export(tools.FormatAnthropic)
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		Name        string          `json:"name"`
		InputSchema json.RawMessage `json:"input_schema"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"untyped":        `{"type":"object","properties":{"n":{"type":"integer"}}}`,
		"empty_schema":   `{"type":"object"}`,
		"a_keyed_write":  `{"type":"object","properties":{"id":{"type":"string"}},"required":["id"],"additionalProperties":false}`,
		"no_description": `{"type":"object","properties":{"id":{"type":"string"}},"required":["id"],"additionalProperties":false}`,
	}
	for _, g := range got {
		if w, ok := want[g.Name]; ok && string(g.InputSchema) != w {
			t.Errorf("%s: %s, want %s", g.Name, g.InputSchema, w)
		}
	}
}

// TestExportRefusesASchemaForArgsThatAreNotAnObject: a schema whose
// top-level type is not object admits no call's args; Export names the
// tool rather than hand the model a definition every API refuses.
func TestExportRefusesASchemaForArgsThatAreNotAnObject(t *testing.T) {
	t.Parallel()
	exec := tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return nil, nil })
	for _, schema := range []string{`{"type":"string"}`, `{"type":["string","null"]}`} {
		reg, err := tools.NewRegistry([]tools.Definition{{Name: "odd", Class: tools.Read, Schema: json.RawMessage(schema), Executor: exec}}, tools.Config{})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range tools.Formats {
			_, err := reg.Export(f)
			var de *tools.DefinitionError
			if !errors.As(err, &de) || de.Tool != "odd" || de.Field != "schema" {
				t.Errorf("%s %s: %v, want a DefinitionError naming odd's schema", schema, f, err)
			}
		}
	}
}

// TestExportTakesTypeObjectInItsArrayForm: a schema whose type is an
// array holding "object" (args are an object, and the registry runs the
// tool's calls) is exported with "type": "object" in its place, the rest
// as written, rather than failing the whole registry's export.
func TestExportTakesTypeObjectInItsArrayForm(t *testing.T) {
	t.Parallel()
	exec := tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })
	reg, err := tools.NewRegistry([]tools.Definition{
		{Name: "a_tool", Class: tools.Read, Executor: exec, Schema: json.RawMessage(`{"type":["object"],"properties":{"q":{"type":"string"}}}`)},
		{Name: "b_tool", Class: tools.Read, Executor: exec, Schema: json.RawMessage(`{"type":"object"}`)},
		{Name: "c_tool", Class: tools.Read, Executor: exec, Schema: json.RawMessage(`{"properties":{"q":{"type":"string"}}, "type" : ["object","null"]}`)},
	}, tools.Config{})
	if err != nil {
		t.Fatalf("the registry refuses the schema: %v", err)
	}
	tool, _ := reg.Lookup("a_tool")
	if err := tool.Validate(json.RawMessage(`{"q":"x"}`)); err != nil {
		t.Fatalf("toolq refuses the args: %v", err)
	}
	out, err := reg.Export(tools.FormatAnthropic)
	if err != nil {
		t.Fatalf("the registry runs a_tool's calls, but its tool list cannot be exported at all: %v", err)
	}
	var got []struct {
		Name        string          `json:"name"`
		InputSchema json.RawMessage `json:"input_schema"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"a_tool": `{"type":"object","properties":{"q":{"type":"string"}}}`,
		"c_tool": `{"properties":{"q":{"type":"string"}},"type":"object"}`,
	}
	for _, g := range got {
		if w, ok := want[g.Name]; ok && string(g.InputSchema) != w {
			t.Errorf("%s: %s, want %s", g.Name, g.InputSchema, w)
		}
	}
}

// TestExportNamesTheFormatsThereAre: an unknown format is ErrUnknownFormat,
// and the error lists the formats.
func TestExportNamesTheFormatsThereAre(t *testing.T) {
	t.Parallel()
	reg := everyClass(t)
	_, err := reg.Export("gemini")
	if !errors.Is(err, tools.ErrUnknownFormat) || err.Error() != `tools: unknown format "gemini" (want anthropic, openai, openai-responses, mcp)` {
		t.Fatalf("%v", err)
	}
	for _, f := range tools.Formats {
		if got, err := tools.ParseFormat(string(f)); got != f || err != nil {
			t.Errorf("%s: %s %v", f, got, err)
		}
	}
}
