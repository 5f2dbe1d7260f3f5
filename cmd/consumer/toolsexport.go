package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/tools"
)

const exportFormats = "anthropic, openai, openai-responses or mcp"

func runToolsExport(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("export", "consumer tools export --format anthropic|openai|openai-responses|mcp [--tools FILE]\n\n"+
		"Prints the registry's tools as a model API's tool definitions (name, description and\n"+
		"input schema), one JSON array, so that each schema is written once, in the registry:\n"+
		"anthropic, the Messages API's tools; openai, Chat Completions' tools; openai-responses,\n"+
		"the Responses API's function tools; mcp, MCP Tool objects (a tools/list result's tools).\n"+
		"A running consumer answers the same over NATS (toolq.tools.list).", stdio)
	format := fs.String("format", "", "the API whose tool definitions to print: "+exportFormats+" (required)")
	file := fs.String("tools", cli.Env(getenv, "TOOLQ_TOOLS", ""), "tool registry file (env TOOLQ_TOOLS); empty: the demo registry")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	if *format == "" {
		return cli.Usagef("--format is required: %s", exportFormats)
	}
	f, err := tools.ParseFormat(*format)
	if err != nil {
		return cli.Usagef("--format %q: want %s", *format, exportFormats)
	}
	reg, err := loadRegistry(*file, cli.Env(getenv, "TOOLQ_SANDBOX_URL", "http://127.0.0.1:8089"), getenv)
	if err != nil {
		return err
	}
	defer reg.Close()
	out, err := reg.Export(f)
	if err != nil {
		return err
	}
	for _, t := range reg.Tools() {
		if t.Description == "" {
			fmt.Fprintf(stdio.Err, "warning: tool %s has no description: the model sees only its name and schema\n", t.Name)
		}
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, out, "", "  "); err != nil {
		return err
	}
	indented.WriteByte('\n')
	_, err = indented.WriteTo(stdio.Out)
	return err
}
