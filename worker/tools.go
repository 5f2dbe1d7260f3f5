package worker

import (
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/toolq/toolq/internal/version"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
)

// ServeTools answers jobs.ToolsSubject with the registry's tools as a model
// API's tool definitions (tools.Registry.Export): a NATS micro service
// (toolq-tools) whose requests are jobs.ToolsRequest, so that an agent's
// tool list is read from the registry that runs its calls and the two
// cannot drift. A request that is not a ToolsRequest or names an unknown
// format is answered with error 400; a registry that cannot be exported
// (a schema for args that are not an object) with 500; a list larger than
// the NATS server's max_payload, which cannot be sent, with 413 naming
// both sizes (the agent reads why instead of timing out). Every consumer
// serves it, in one queue group. Stop the service when done.
func ServeTools(nc *nats.Conn, reg *tools.Registry, log *slog.Logger) (micro.Service, error) {
	if log == nil {
		log = slog.Default()
	}
	return micro.AddService(nc, micro.Config{
		Name:        "toolq-tools",
		Version:     semver(version.Get().Version),
		Description: "the tools of toolq's registry as a model API's tool definitions",
		Endpoint: &micro.EndpointConfig{Subject: jobs.ToolsSubject, Handler: micro.HandlerFunc(func(req micro.Request) {
			var r jobs.ToolsRequest
			if err := json.Unmarshal(req.Data(), &r); err != nil {
				req.Error("400", `want {"format": "anthropic"}, "openai", "openai-responses" or "mcp": `+err.Error(), nil)
				return
			}
			f, err := tools.ParseFormat(r.Format)
			if err != nil {
				req.Error("400", err.Error(), nil)
				return
			}
			out, err := reg.Export(f)
			if err != nil {
				log.Warn("tool list refused", "format", f, "error", err)
				req.Error("500", err.Error(), nil)
				return
			}
			if limit := nc.MaxPayload(); int64(len(out)) > limit {
				msg := fmt.Sprintf("the tool list (%s) is %d bytes, over the NATS server's max_payload of %d: raise max_payload, or shorten the registry's descriptions", f, len(out), limit)
				log.Warn("tool list refused", "format", f, "error", msg)
				req.Error("413", msg, nil)
				return
			}
			if err := req.Respond(out); err != nil {
				log.Warn("tool list not sent", "format", f, "bytes", len(out), "error", err)
				req.Error("500", fmt.Sprintf("the tool list (%s, %d bytes) could not be sent: %v", f, len(out), err), nil)
			}
		})},
	})
}
