package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/toolq/toolq/internal/jsretry"
)

// ToolsSubject is the subject of the consumers' tool list: a NATS request
// whose body is a ToolsRequest, answered with the consumer's registry as a
// model API's tool definitions, one JSON array (a NATS micro service,
// toolq-tools, discoverable under $SRV). Who may ask is a NATS permission.
const ToolsSubject = "toolq.tools.list"

// ToolsRequest is the body of a request on ToolsSubject.
type ToolsRequest struct {
	// Format is the API whose tool definitions to answer with: "anthropic"
	// (the Messages API's tools), "openai" (Chat Completions' tools),
	// "openai-responses" (the Responses API's function tools) or "mcp"
	// (MCP Tool objects, as a tools/list result's tools).
	Format string `json:"format"`
}

// ErrToolsRefused is a tool list the service answered with an error (an
// unknown format: 400; a tool whose schema no API takes: 500; a list
// larger than the NATS server's max_payload: 413).
var ErrToolsRefused = errors.New("jobs: tool list refused")

// Tools asks the consumers for their registry's tools as the tool
// definitions of format ("anthropic", "openai", "openai-responses" or
// "mcp"): one JSON array, to hand the model as it is, so that an agent's
// tool list is the registry's. The answer is the registry of the consumer
// that answered: consumers that run different registries each answer with
// their own. Errors: ErrToolsRefused (wrapped, with the service's code and
// description), or the request's (no consumer answers:
// nats.ErrNoResponders).
func (c *Client) Tools(ctx context.Context, format string) (json.RawMessage, error) {
	body, err := json.Marshal(ToolsRequest{Format: format})
	if err != nil {
		return nil, err
	}
	msg, err := jsretry.Do(ctx, func(ctx context.Context) (*nats.Msg, error) { // another consumer answers for a stopped one
		return c.js.Conn().RequestWithContext(ctx, ToolsSubject, body)
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: tools %s: %w", format, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		return nil, fmt.Errorf("%w: %s %s", ErrToolsRefused, code, msg.Header.Get(micro.ErrorHeader))
	}
	if !json.Valid(msg.Data) {
		return nil, fmt.Errorf("jobs: tools %s: the answer is not JSON", format)
	}
	return json.RawMessage(msg.Data), nil
}
