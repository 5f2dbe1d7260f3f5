package tools_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/toolq/toolq/tools"
)

// The registry's tools as a model API's tool definitions: the schema is
// written once, in the registry.
func ExampleRegistry_Export() {
	exec := tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) { return nil, nil })
	reg, err := tools.NewRegistry([]tools.Definition{{
		Name:        "get_weather",
		Description: "The weather in a city.",
		Class:       tools.Read,
		Schema:      json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`),
		Executor:    exec,
	}}, tools.Config{})
	if err != nil {
		panic(err)
	}
	for _, f := range []tools.Format{tools.FormatAnthropic, tools.FormatOpenAI, tools.FormatMCP} {
		out, err := reg.Export(f)
		fmt.Println(string(out), err)
	}
	// Output:
	// [{"name":"get_weather","description":"The weather in a city.","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}] <nil>
	// [{"type":"function","function":{"name":"get_weather","description":"The weather in a city.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}] <nil>
	// [{"name":"get_weather","description":"The weather in a city.","inputSchema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"annotations":{"readOnlyHint":true}}] <nil>
}
