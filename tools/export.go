package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Format names the shape of tool definitions a model API takes. Export
// writes the registry in each, so that a tool's name, description and
// schema are written once, in the registry, and an agent's tool list is
// read from it.
type Format string

const (
	// FormatAnthropic is the Messages API's tools: [{name, description,
	// input_schema}].
	FormatAnthropic Format = "anthropic"
	// FormatOpenAI is the Chat Completions API's tools: [{type: "function",
	// function: {name, description, parameters}}], without strict mode.
	FormatOpenAI Format = "openai"
	// FormatOpenAIResponses is the Responses API's function tools, flat:
	// [{type: "function", name, description, parameters, strict: false}]
	// (that API turns strict mode on when strict is not given).
	FormatOpenAIResponses Format = "openai-responses"
	// FormatMCP is MCP's Tool objects, as a tools/list result's tools
	// member holds them: [{name, description, inputSchema, annotations}].
	FormatMCP Format = "mcp"
)

// Formats lists every Format, in the order help texts name them.
var Formats = []Format{FormatAnthropic, FormatOpenAI, FormatOpenAIResponses, FormatMCP}

// ErrUnknownFormat is wrapped by the error of ParseFormat and Export for a
// format that is not one of Formats.
var ErrUnknownFormat = errors.New("tools: unknown format")

// ParseFormat returns the Format called s, or an error wrapping
// ErrUnknownFormat that names the formats there are.
func ParseFormat(s string) (Format, error) {
	for _, f := range Formats {
		if string(f) == s {
			return f, nil
		}
	}
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = string(f)
	}
	return "", fmt.Errorf("%w %q (want %s)", ErrUnknownFormat, s, strings.Join(names, ", "))
}

// Export returns the registry's tools, in name order, as the tool
// definitions of format f: one JSON array, whose elements are the format's
// tool objects (for FormatMCP, the array is a tools/list result's tools).
//
// Each tool's schema is its InputSchema; a tool whose schema says its args
// are not an object makes Export fail with that *DefinitionError. A tool
// with no description is written without one (the model then sees only its
// name and schema). For MCP, a read tool is annotated readOnlyHint: true;
// every other class is a write: readOnlyHint: false and idempotentHint:
// false, because toolq makes one call delivered twice take effect once,
// but a second call with the same arguments (in another turn, or a second
// identical call in one response) is another call and takes effect again.
func (r *Registry) Export(f Format) (json.RawMessage, error) {
	if _, err := ParseFormat(string(f)); err != nil {
		return nil, err
	}
	out := make([]any, 0, len(r.names))
	for _, t := range r.Tools() {
		schema, err := t.InputSchema()
		if err != nil {
			return nil, err
		}
		switch f {
		case FormatAnthropic:
			out = append(out, anthropicTool{Name: t.Name, Description: t.Description, InputSchema: schema})
		case FormatOpenAI:
			out = append(out, openAITool{Type: "function", Function: openAIFunction{Name: t.Name, Description: t.Description, Parameters: schema}})
		case FormatOpenAIResponses:
			out = append(out, openAIResponsesTool{Type: "function", Name: t.Name, Description: t.Description, Parameters: schema})
		case FormatMCP:
			out = append(out, mcpTool{Name: t.Name, Description: t.Description, InputSchema: schema, Annotations: mcpAnnotationsOf(t.Class)})
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // descriptions and patterns as written: "<", not "\u003c"
	if err := enc.Encode(out); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type openAITool struct {
	Type     string         `json:"type"`
	Function openAIFunction `json:"function"`
}

type openAIFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

type openAIResponsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
	// Strict is false: strict mode takes a subset of JSON Schema that a
	// registry's schemas need not keep to, and toolq checks the args
	// against the whole schema before a call runs.
	Strict bool `json:"strict"`
}

type mcpTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"inputSchema"`
	Annotations mcpAnnotations  `json:"annotations"`
}

type mcpAnnotations struct {
	ReadOnlyHint   bool  `json:"readOnlyHint"`
	IdempotentHint *bool `json:"idempotentHint,omitempty"` // for writes only: MCP reads it only when readOnlyHint is false
}

// mcpAnnotationsOf says what MCP's hints can truthfully say of a class:
// read or not. Any class but Read is a write, including classes added
// after this was written.
func mcpAnnotationsOf(c Class) mcpAnnotations {
	if c == Read {
		return mcpAnnotations{ReadOnlyHint: true}
	}
	notIdempotent := false
	return mcpAnnotations{IdempotentHint: &notIdempotent}
}

// InputSchema returns the tool's schema as model APIs and MCP take it: an
// object schema, "type": "object" at the top. A schema that says so is
// SchemaJSON as written; one with no top-level type gets the member added
// first, the rest as written (toolq takes only a JSON object as args
// whatever the schema says, so this changes nothing toolq accepts); one
// whose type is an array that holds "object" ("type": ["object", "null"])
// gets "type": "object" in its place, for the same reason. A
// schema whose top-level type is another describes args no call can have:
// the error is a *DefinitionError naming the tool and its schema.
func (t *Tool) InputSchema() (json.RawMessage, error) {
	bad := func(format string, args ...any) error {
		return &DefinitionError{Tool: t.Name, Field: "schema", Msg: fmt.Sprintf(format, args...)}
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(t.SchemaJSON, &top); err != nil {
		return nil, bad("not a JSON object: %v", err)
	}
	typ, ok := top["type"]
	if !ok {
		rest := bytes.TrimSpace(t.SchemaJSON)[1:] // after the '{'
		sep := []byte(",")
		if bytes.HasPrefix(bytes.TrimSpace(rest), []byte("}")) {
			sep = nil
		}
		return append(append([]byte(`{"type":"object"`), sep...), rest...), nil
	}
	var s string
	if json.Unmarshal(typ, &s) == nil && s == "object" {
		return t.SchemaJSON, nil
	}
	var types []string
	if json.Unmarshal(typ, &types) == nil && slices.Contains(types, "object") {
		return withObjectType(t.SchemaJSON)
	}
	return nil, bad(`a model's tool definition needs "type": "object" at the top (args are a JSON object), not "type": %s`, typ)
}

// withObjectType is schema, an object whose top-level "type" is an array,
// with that member's value replaced by "object", the rest as written. Model
// APIs take only "type": "object" at the top; toolq takes only an object
// as args, so the array's other types admit no call.
func withObjectType(schema json.RawMessage) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(schema))
	if _, err := dec.Token(); err != nil { // '{'
		return nil, err
	}
	for dec.More() {
		name, err := dec.Token()
		if err != nil {
			return nil, err
		}
		from := dec.InputOffset() // after the name: the ':' and the value follow
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, err
		}
		if name == "type" {
			to := dec.InputOffset()
			out := append(append(append([]byte(nil), schema[:from]...), `:"object"`...), schema[to:]...)
			return out, nil
		}
	}
	return nil, errors.New(`tools: the schema has no "type"`)
}
