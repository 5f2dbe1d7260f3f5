// Package demo carries the demo tool registry, demo/tools.yaml, so
// that the consumer can run it without a file on disk.
package demo

import (
	_ "embed"

	"github.com/toolq/toolq/tools"
)

// ToolsYAML is demo/tools.yaml.
//
//go:embed tools.yaml
var ToolsYAML []byte

// DemoRegistry loads the demo registry with its tools pointed at sandboxURL.
func DemoRegistry(sandboxURL string, opts ...tools.LoadOption) (*tools.Registry, error) {
	getenv := func(name string) string {
		if name == "SANDBOX_URL" {
			return sandboxURL
		}
		return ""
	}
	return tools.Parse(ToolsYAML, "demo/tools.yaml", append([]tools.LoadOption{tools.WithGetenv(getenv)}, opts...)...)
}
