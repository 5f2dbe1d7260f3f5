package mcpfront_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/mcpfront"
	"github.com/toolq/toolq/worker"
)

// TestACallJustUnderTheBodyLimitIsAnsweredNotLostInTheDLQ: the front door
// measures a call's job exactly as it is published (with its version and
// created_at), so a job over --max-body-size by the few bytes those add is
// answered rejected, every time it is sent, rather than dead-lettered by
// the worker and its client told to send it again forever.
func TestACallJustUnderTheBodyLimitIsAnsweredNotLostInTheDLQ(t *testing.T) {
	t.Parallel()
	const conv, turn = "conv-size", 1
	args := map[string]any{"text": strings.Repeat("x", 2000)}
	raw, _ := json.Marshal(args)
	// The job without what Publish adds: version and created_at.
	j := &jobs.Job{ConversationID: conv, TurnIndex: turn, Tool: "store_note", Args: raw}
	k, err := j.Key()
	if err != nil {
		t.Fatal(err)
	}
	j.ToolUseID = "mcp_" + k
	measured, _ := json.Marshal(j)
	limit := len(measured) + 8 // the front door's and the workers' limit: that job fits with room to spare; the published one does not

	st, n := noteStack(t, worker.Config{MaxBodySize: limit})
	_, addr := serve(t, st, nil, func(c *mcpfront.Config) { c.MaxBodySize = limit; c.Wait = 5 * time.Second })
	cs := connect(t, addr)
	for attempt := 1; attempt <= 2; attempt++ { // the call, then its re-issue
		res, err := call(context.Background(), cs, "store_note", args, named(conv, turn))
		if err != nil {
			t.Fatalf("attempt %d: a call that fits the front door's limit got no result (%d job(s) in %s, %d effect(s)): %v",
				attempt, streamMsgs(t, st, jobs.DLQStream), jobs.DLQStream, n.count(args["text"].(string)), err)
		}
		if !res.IsError && n.count(args["text"].(string)) != 1 {
			t.Fatalf("ok without one effect")
		}
		if status(res) != "rejected" || !strings.Contains(text(t, res), "too_large") {
			t.Fatalf("attempt %d: want rejected, too_large: %s", attempt, asJSON(t, res))
		}
	}
	if got := streamMsgs(t, st, jobs.DLQStream); got != 0 {
		t.Fatalf("%d dead letter(s): the job was queued", got)
	}
}

// TestACallTheBrokerRefusesIsNotToldToReissue: a job larger than the NATS
// server's max_payload (here with Config.MaxBodySize 0, no limit of the
// front door's own) is never queued: the call is answered rejected, not
// with CodeNoResultYet's "it may be queued or running: send it again",
// which would have the client loop.
func TestACallTheBrokerRefusesIsNotToldToReissue(t *testing.T) {
	t.Parallel()
	st, _ := noteStack(t, worker.Config{MaxBodySize: 4 << 20})
	_, addr := serve(t, st, nil)                                  // MaxBodySize 0
	args := map[string]any{"text": strings.Repeat("y", 1200<<10)} // > 1 MiB, < the SDK's 4 MiB request limit
	res, err := call(context.Background(), connect(t, addr), "store_note", args, named("conv-huge", 1))
	var rpc *jsonrpc.Error
	if errors.As(err, &rpc) && rpc.Code == mcpfront.CodeNoResultYet {
		t.Fatalf("a job that was never queued is reported as maybe queued, to send again: %s", rpc.Message)
	}
	if err != nil || status(res) != "rejected" || !strings.Contains(text(t, res), "max_payload") {
		t.Fatalf("got %v %s", err, asJSON(t, res))
	}
}
