package main

import (
	"context"
	"strings"
	"time"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/tools"
)

func runToolsImport(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("import", "consumer tools import (--mcp-url URL | --mcp-command \"CMD ARGS\") > tools.yaml\n\n"+
		"Reads the tools an MCP server lists and prints them as a registry file: its description,\n"+
		"its input schema as the schema, the mcp executor that reaches it, and a PROPOSED class\n"+
		"(read when the server says readOnlyHint: true, else unkeyed_write). Annotations are hints\n"+
		"from a server that may not be trusted: review the file, decide each class, then merge it.", stdio)
	url := fs.String("mcp-url", "", "the MCP server's Streamable HTTP endpoint, e.g. http://127.0.0.1:3001/mcp")
	command := fs.String("mcp-command", "", "start a local MCP server and speak to it over stdio, e.g. \"npx -y some-mcp-server stdio\" (split at spaces)")
	var headers repeated
	fs.Var(&headers, "mcp-header", "an HTTP header for --mcp-url, \"Name: value\" (repeatable); written into the file as given, so pass ${VAR} references for secrets")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the server")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	m := tools.MCP{URL: *url, Command: strings.Fields(*command)}
	switch {
	case (*url == "") == (*command == ""):
		return cli.Usagef("give one of --mcp-url and --mcp-command")
	case len(headers) > 0 && *url == "":
		return cli.Usagef("--mcp-header is for --mcp-url")
	}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return cli.Usagef("--mcp-header %q: want \"Name: value\"", h)
		}
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		m.Headers[strings.TrimSpace(name)] = strings.TrimSpace(value)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	out, err := tools.ImportMCP(ctx, m, getenv)
	if err != nil {
		return cli.WithCode(cli.ExitUnavailable, err)
	}
	_, err = stdio.Out.Write(out)
	return err
}

// repeated is a flag given any number of times.
type repeated []string

func (r *repeated) String() string { return strings.Join(*r, ", ") }

func (r *repeated) Set(v string) error {
	*r = append(*r, v)
	return nil
}
