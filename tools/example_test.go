package tools_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/toolq/toolq/tools"
)

// A registry built in Go: a built-in executor, its schema, its class.
func ExampleNewRegistry() {
	echo := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		if r.Key == "" {
			return nil, tools.DefiniteError("no_key", "a write needs its key")
		}
		return json.RawMessage(`{"stored":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{
		Name:     "store_note",
		Class:    tools.KeyedWrite,
		Schema:   json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`),
		Executor: echo,
	}})
	if err != nil {
		panic(err)
	}
	tool, _ := reg.Lookup("store_note")
	out, err := tool.Run(context.Background(), tools.Request{Key: "k1", Args: json.RawMessage(`{"text":"hi"}`)})
	fmt.Println(string(out), err)
	_, err = tool.Run(context.Background(), tools.Request{Key: "k1", Args: json.RawMessage(`{"text":1}`)})
	fmt.Println(err)
	fmt.Println(tool.Audit().CanDoubleFire, tool.Lease > tool.Timeout)
	// Output:
	// {"stored":true} <nil>
	// tools: invalid arguments: at /text: got number, want string
	// false true
}
