package main

import (
	"context"
	"fmt"

	"github.com/toolq/toolq/demo"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/tools"
)

// loadRegistry loads --tools, or the demo registry pointed at sandboxURL.
func loadRegistry(path, sandboxURL string, getenv func(string) string) (*tools.Registry, error) {
	if path == "" {
		return demo.Registry(sandboxURL, tools.Config{})
	}
	return tools.Load(path, tools.Config{Getenv: getenv})
}

func runToolsAudit(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("audit", "consumer tools audit [--tools FILE] [--json]\n\n"+
		"Prints, for each tool of the registry, its class, whether it uses the ledger and\n"+
		"forwards its key, and whether it can take effect twice, and why.", stdio)
	file := fs.String("tools", cli.Env(getenv, "TOOLQ_TOOLS", ""), "tool registry file (env TOOLQ_TOOLS); empty: the demo registry")
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	reg, err := loadRegistry(*file, cli.Env(getenv, "TOOLQ_SANDBOX_URL", "http://127.0.0.1:8089"), getenv)
	if err != nil {
		return err
	}
	audits := []tools.Audit{}
	for _, t := range reg.Tools() {
		audits = append(audits, t.Audit())
	}
	if *asJSON {
		return cli.PrintJSON(stdio.Out, audits)
	}
	w := cli.NewTable(stdio.Out)
	fmt.Fprintln(w, "TOOL\tCLASS\tLEDGER\tKEY FORWARDED\tCAN DOUBLE-FIRE")
	for _, a := range audits {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s, because %s\n", a.Name, a.Class, onOff(a.Ledger), yesNo(a.KeyForwarded), yesNo(a.CanDoubleFire), a.Why)
	}
	return w.Flush()
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
