package tools_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/toolq/toolq/tools"
)

// A registry built in Go: a built-in executor, its schema, its class. Args
// are validated once, before Run.
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
	}}, tools.Config{})
	if err != nil {
		panic(err)
	}
	tool, _ := reg.Lookup("store_note")
	run := func(args string) {
		if err := tool.Validate(json.RawMessage(args)); err != nil {
			fmt.Println(err)
			return
		}
		out, err := tool.Run(context.Background(), tools.Request{Key: "k1", Args: json.RawMessage(args)})
		fmt.Println(string(out), err)
	}
	run(`{"text":"hi"}`)
	run(`{"text":1}`)
	fmt.Println(tool.Audit().CanDoubleFire, tool.Lease > tool.Timeout)
	// Output:
	// {"stored":true} <nil>
	// tools: invalid arguments: at /text: got number, want string
	// false true
}
