package worker_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestTheSchemaChecksEachNumberAsWritten: the worker validates args from the
// parse that made the key, and a schema must still see each number as the
// agent wrote it, not its nearest double: 99.990000000000000001 is over a
// maximum of 99.99 and 1.0000000000000000001 no multiple of 0.01, though
// both are written with more digits than a double keeps (as doubles they
// are 99.99 and 1, which the schema takes).
func TestTheSchemaChecksEachNumberAsWritten(t *testing.T) {
	t.Parallel()
	var ran atomic.Int32
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite,
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			ran.Add(1)
			return json.RawMessage(`{"paid":true}`), nil
		}),
		Schema: json.RawMessage(`{"type":"object","required":["amount"],"properties":{"amount":{"type":"number","multipleOf":0.01,"maximum":99.99},"lines":{"type":"array","items":{"type":"integer"}}}}`)}},
		tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := sharedEnv(t)
	defer runWorker(t, js, store, reg, worker.Config{})()
	conv := "conv-schema-numbers"
	want := map[string]jobs.Status{
		`{"amount":19.99,"lines":[1,2.0]}`:             jobs.StatusOK,
		`{"amount":19.991}`:                            jobs.StatusRejected,
		`{"amount":99.990000000000000001}`:             jobs.StatusRejected,
		`{"amount":1.0000000000000000001}`:             jobs.StatusRejected,
		`{"amount":1,"lines":[1.0000000000000000001]}`: jobs.StatusRejected,
	}
	byID := map[string]string{}
	i := 0
	for args := range want {
		i++
		j := jobs.Job{ConversationID: conv, TurnIndex: int64(i), Tool: "pay", ToolUseID: "toolu_" + string(rune('a'+i)), Args: json.RawMessage(args)}
		publish(t, js, &j)
		byID[j.ToolUseID] = args
	}
	for _, r := range resultsOf(t, js, conv, len(want)) {
		args := byID[r.ToolUseID]
		if r.Status != want[args] || (r.Status == jobs.StatusRejected && (r.Error == nil || r.Error.Code != "invalid_args")) {
			t.Errorf("%s: %s %+v, want %s", args, r.Status, r.Error, want[args])
		}
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("the tool ran %d times, want once (only the valid args)", n)
	}
}
