// Package demo is toolq's demonstration material: the demo tool registry
// (demo/tools.yaml, embedded here so that the consumer runs it without a
// file on disk), in demo/sandbox the payments and tickets API its tools call,
// and in demo/simulate the streaming-agent scenario of `publisher simulate`.
// The demo, the tests and the benchmarks use them; nothing in the worker's
// path does.
package demo

import (
	_ "embed"

	"github.com/toolq/toolq/tools"
)

// ToolsYAML is demo/tools.yaml.
//
//go:embed tools.yaml
var ToolsYAML []byte

// Registry loads the demo registry with its tools pointed at sandboxURL.
// cfg's Getenv is not used: ${TOOLQ_SANDBOX_URL} is sandboxURL and every other
// variable is unset. Errors are those of tools.Parse.
func Registry(sandboxURL string, cfg tools.Config) (*tools.Registry, error) {
	cfg.Getenv = func(name string) string {
		if name == "TOOLQ_SANDBOX_URL" {
			return sandboxURL
		}
		return ""
	}
	return tools.Parse(ToolsYAML, "demo/tools.yaml", cfg)
}
