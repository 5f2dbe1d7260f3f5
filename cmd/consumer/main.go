// Command consumer is toolq's worker and the operator's ledger commands:
// `consumer` (or `consumer run`) processes jobs; `consumer migrate` applies
// the ledger schema; `consumer ledger …` inspects and resolves ledger rows.
package main

import (
	"context"

	"github.com/toolq/toolq/internal/cli"
)

func main() { cli.Main("consumer", cli.Traced("toolq-consumer", run)) }

var commands = &cli.Commands{Name: "consumer", Default: "run", List: []cli.Command{
	{Name: "run", Summary: "process jobs", Run: runWorker},
	{Name: "migrate", Summary: "apply the ledger schema", Run: runMigrate},
	{Name: "tools", Summary: "audit, export, import: which tools can take effect twice; the tools as a model's tool definitions; an MCP server's tools as a registry file", Run: toolsCommands.Run},
	{Name: "ledger", Summary: "ls, show KEY, resolve KEY, purge: inspect and settle ledger rows", Run: ledgerCommands.Run},
	{Name: "approve", Summary: "approve a call awaiting approval: it runs once (KEY, --reason TEXT, --by NAME)", Run: runApprove},
	{Name: "deny", Summary: "deny a call awaiting approval: it never runs (KEY, --reason TEXT, --by NAME)", Run: runDeny},
	{Name: "healthcheck", Summary: "exit 0 when a URL answers 2xx (default: this host's /readyz): for container healthchecks", Run: runHealthcheck},
	cli.Version("consumer"),
}}

var toolsCommands = &cli.Commands{Name: "consumer tools", List: []cli.Command{
	{Name: "audit", Summary: "which tools can take effect twice, and why (--tools FILE, --json)", Run: runToolsAudit},
	{Name: "export", Summary: "print the tools as a model API's tool definitions (--format anthropic|openai|openai-responses|mcp, --tools FILE)", Run: runToolsExport},
	{Name: "import", Summary: "print an MCP server's tools as a registry file to review (--mcp-url URL | --mcp-command CMD)", Run: runToolsImport},
}}

var ledgerCommands = &cli.Commands{Name: "consumer ledger", List: []cli.Command{
	{Name: "ls", Summary: "list ledger rows (--state S, --stale, --tool T, --conversation C, --tenant T, --older-than D, --json)", Run: ledgerLs},
	{Name: "show", Summary: "show one row and its history (KEY or the call's fields, --json)", Run: ledgerShow},
	{Name: "resolve", Summary: "settle an indeterminate row (KEY, --output JSON | --not-run, --reason TEXT)", Run: ledgerResolve},
	{Name: "purge", Summary: "delete finished rows older than D (--older-than D)", Run: ledgerPurge},
}}

func run(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	return commands.Run(ctx, args, stdio, getenv)
}
