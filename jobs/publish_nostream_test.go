package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// TestAPublishNoStreamTakesFailsAtOnceAndNamesTheFix: on a server where no
// consumer created the streams, a publish with a deadline (an agent's
// RunTurn, `publisher publish`, whose --timeout is 30s) fails at once with
// the message that names the fix, not at its deadline with a context's
// error.
func TestAPublishNoStreamTakesFailsAtOnceAndNamesTheFix(t *testing.T) {
	n := testenv.StartNATS(t) // no streams
	js, _ := jetstream.New(n.Connect())
	c := jobs.NewClient(js)
	for i, d := range []time.Duration{3000 * time.Millisecond, 3250 * time.Millisecond, 3500 * time.Millisecond} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			start := time.Now()
			_, err := c.Publish(ctx, &jobs.Job{ConversationID: "c", TurnIndex: 1, Tool: "send_payment",
				ToolUseID: fmt.Sprintf("toolu_%d", i), Args: json.RawMessage(`{}`)})
			took := time.Since(start)
			if took > 1500*time.Millisecond || err == nil || !strings.Contains(err.Error(), "first consumer that starts") {
				t.Errorf("deadline %v: failed after %v with %v; want at once, with the fix named", d, took.Round(10*time.Millisecond), err)
			}
		})
	}
}
