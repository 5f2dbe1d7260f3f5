package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.yaml.in/yaml/v3"

	"github.com/toolq/toolq/jobs"
)

// ImportMCP reads the tools an MCP server lists (tools/list, every page)
// and writes them as a registry file, for an operator to review, edit and
// merge: each entry has the server's description and input schema, the
// mcp executor that reaches it (m's URL and headers, or its command and
// env), and a proposed class. The class comes from the server's
// annotations, which are hints from a server that may not be trusted:
// readOnlyHint true proposes read, anything else unkeyed_write, never
// keyed_write, which only the operator can know (the server must honour
// the key). A name toolq cannot take (it allows [a-zA-Z0-9_-], 64 at
// most) is changed, and mcp.tool keeps the server's. The ${VAR} references
// of m's URL, command, env and headers are expanded with getenv (nil:
// os.Getenv) to reach the server, and written as given.
func ImportMCP(ctx context.Context, m MCP, getenv func(string) string) ([]byte, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	reach, err := m.expanded(getenv)
	if err != nil {
		return nil, err
	}
	reach.Tool = "tools/list"
	e, err := MCPExecutor(reach)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	s, _, err := e.pool.get(ctx, false)
	if err != nil {
		return nil, fmt.Errorf("connect to the MCP server: %w", reach.secrets.redactError(err))
	}
	defer e.pool.put(s, true) // closed with the executor
	var listed []*mcp.Tool
	for t, err := range s.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("tools/list: %w", reach.secrets.redactError(err))
		}
		listed = append(listed, t)
	}
	if len(listed) == 0 {
		return nil, fmt.Errorf("the MCP server lists no tools")
	}
	return registryFile(m, s.InitializeResult(), listed)
}

var invalidNameChars = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// registryName is a toolq name for an MCP tool name, unique among taken.
func registryName(name string, taken map[string]bool) string {
	base := invalidNameChars.ReplaceAllString(name, "_")
	if base == "" {
		base = "tool"
	}
	if len(base) > 64 {
		base = base[:64]
	}
	n := base
	for i := 2; taken[n] || !jobs.ValidToolName(n); i++ {
		suffix := "_" + strconv.Itoa(i)
		n = base[:min(len(base), 64-len(suffix))] + suffix
	}
	taken[n] = true
	return n
}

func registryFile(m MCP, init *mcp.InitializeResult, listed []*mcp.Tool) ([]byte, error) {
	where := "the MCP server at " + m.URL
	if m.URL == "" {
		where = "the MCP server started by `" + strings.Join(m.Command, " ") + "`"
	}
	if init != nil && init.ServerInfo != nil {
		where += fmt.Sprintf(" (%s %s)", init.ServerInfo.Name, init.ServerInfo.Version)
	}
	where = printable(where)
	var list yaml.Node
	list.Kind = yaml.SequenceNode
	taken := map[string]bool{}
	for _, t := range listed {
		entry, err := registryEntry(m, t, registryName(t.Name, taken))
		if err != nil {
			return nil, fmt.Errorf("tool %q: %w", t.Name, err)
		}
		list.Content = append(list.Content, entry)
	}
	doc := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{scalar("tools"), &list}}
	doc.HeadComment = "Imported from " + where + " by `consumer tools import` (tools/list).\n" +
		"Review every entry before use. Each class is a PROPOSAL from the server's annotations,\n" +
		"which are hints from a server that may not be trusted: the class is your decision.\n" +
		"  read           the tool changes nothing (retried freely, no ledger)\n" +
		"  unkeyed_write  proposed for every other tool: a call is never run twice, and an\n" +
		"                 uncertain outcome waits for an operator (consumer ledger resolve)\n" +
		"  keyed_write    only if the server honours the key toolq sends in _meta\n" +
		"                 (io.toolq/idempotency-key) or the Idempotency-Key header\n" +
		"Set timeout, concurrency and breaker as the server needs (docs/tools.md)."
	quoteTabbedLines(doc)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	// What a server lists must not make a file that does not load.
	if _, err := Parse(buf.Bytes(), "import", Config{Getenv: func(string) string { return "x" }}); err != nil {
		return nil, fmt.Errorf("the tools the server lists do not make a registry toolq can load: %w", err)
	}
	return buf.Bytes(), nil
}

func registryEntry(m MCP, t *mcp.Tool, name string) (*yaml.Node, error) {
	schema, err := json.Marshal(t.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("input schema: %w", err)
	}
	var value any
	if err := json.Unmarshal(schema, &value); err != nil {
		return nil, fmt.Errorf("input schema: %w", err)
	}
	var schemaNode yaml.Node
	if err := schemaNode.Encode(value); err != nil {
		return nil, fmt.Errorf("input schema: %w", err)
	}
	class, why := UnkeyedWrite, "proposed: the server does not say the tool is read-only"
	if t.Annotations != nil && t.Annotations.ReadOnlyHint {
		class, why = Read, "proposed: the server says readOnlyHint: true"
	}
	entry := &yaml.Node{Kind: yaml.MappingNode}
	add := func(k string, v *yaml.Node) { entry.Content = append(entry.Content, scalar(k), v) }
	add("name", scalar(name))
	if d := t.Description; d != "" {
		add("description", scalar(d))
	}
	classNode := scalar(string(class))
	classNode.LineComment = why
	add("class", classNode)
	add("schema", &schemaNode)
	exec := &yaml.Node{Kind: yaml.MappingNode}
	addTo := func(n *yaml.Node, k string, v *yaml.Node) { n.Content = append(n.Content, scalar(k), v) }
	if m.URL != "" {
		addTo(exec, "url", scalar(m.URL))
		if len(m.Headers) > 0 {
			h := &yaml.Node{Kind: yaml.MappingNode}
			for _, k := range sortedKeys(m.Headers) {
				addTo(h, k, scalar(m.Headers[k]))
			}
			addTo(exec, "headers", h)
		}
	} else {
		cmd := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		for _, w := range m.Command {
			cmd.Content = append(cmd.Content, scalar(w))
		}
		addTo(exec, "command", cmd)
		if len(m.Env) > 0 {
			env := &yaml.Node{Kind: yaml.MappingNode}
			for _, k := range sortedKeys(m.Env) {
				addTo(env, k, scalar(m.Env[k]))
			}
			addTo(exec, "env", env)
		}
	}
	addTo(exec, "tool", scalar(t.Name))
	add("mcp", exec)
	return entry, nil
}

func scalar(v string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Value: v, Tag: "!!str"} // the encoder picks a style that reads back

}

// quoteTabbedLines writes in double quotes the strings of n that have
// several lines and a tab: yaml.v3 writes them as a block it cannot read
// back.
func quoteTabbedLines(n *yaml.Node) {
	if n.Kind == yaml.ScalarNode && strings.Contains(n.Value, "\n") && strings.Contains(n.Value, "\t") {
		n.Style = yaml.DoubleQuotedStyle
	}
	for _, c := range n.Content {
		quoteTabbedLines(c)
	}
}

// printable is s with its control characters replaced, for a comment.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			return '?'
		}
		return r
	}, s)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
