package worker_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestResultLargerThanTheBrokerTakesIsStillAnswered: a tool whose output
// is larger than the broker's max payload (1 MiB by default) has taken
// effect; its job is answered with a result that says so, the ledger keeps
// the whole output, and a duplicate is answered the same way. An HTML-like
// output is carried whole: it is not escaped into six bytes a character.
func TestResultLargerThanTheBrokerTakesIsStillAnswered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	html := `{"page":"` + strings.Repeat("<p>&amp;</p>", 200<<10/12) + `"}`
	huge := `{"blob":"` + strings.Repeat("x", 3<<19) + `"}`
	out := map[string]string{"html": html, "huge": huge}
	exec := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		var args struct{ Which string }
		json.Unmarshal(r.Args, &args)
		return json.RawMessage(out[args.Which]), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "fetch", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`), Executor: exec}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, store := startWorker(t, reg, worker.Config{})
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()

	r, err := client.PublishAndAwait(actx, &jobs.Job{ConversationID: "c", Tool: "fetch", ToolUseID: "toolu_h", Args: json.RawMessage(`{"which":"html"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != jobs.StatusOK || string(r.Output) != html {
		t.Fatalf("an HTML-like output of %d bytes was not carried whole: status %s, %d bytes", len(html), r.Status, len(r.Output))
	}

	j := &jobs.Job{ConversationID: "c", Tool: "fetch", ToolUseID: "toolu_x", Args: json.RawMessage(`{"which":"huge"}`)}
	for _, id := range []string{"toolu_x", "toolu_x2"} {
		j.ToolUseID = id
		r, err := client.PublishAndAwait(actx, j)
		if err != nil {
			t.Fatalf("%s: %v (a result over the max payload must not be retried forever)", id, err)
		}
		var marker struct {
			TooLarge bool `json:"response_too_large"`
			Bytes    int  `json:"bytes"`
		}
		if err := json.Unmarshal(r.Output, &marker); err != nil || r.Status != jobs.StatusOK || !marker.TooLarge || marker.Bytes != len(huge) {
			t.Fatalf("%s: %+v, output %.200s", id, r, r.Output)
		}
		if (id == "toolu_x2") != r.Duplicate {
			t.Fatalf("%s: duplicate = %v", id, r.Duplicate)
		}
	}
	key, _ := j.Key()
	if row, err := store.Get(ctx, key); err != nil || row.State != ledger.Completed || len(row.Result) != len(huge) {
		t.Fatalf("the ledger does not keep the whole output: %v, %d bytes", err, len(row.Result))
	}
}

// TestPublishAndAwaitTwiceWithOneToolUseID: publishing the same job again,
// same tool_use_id (JetStream drops it as an exact re-publication), still
// returns its result, which was published before the second call began.
func TestPublishAndAwaitTwiceWithOneToolUseID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
			return json.RawMessage(`{"paid":1}`), nil
		})}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{})
	client := jobs.NewClient(js)
	j := &jobs.Job{ConversationID: "c", Tool: "pay", ToolUseID: "toolu_same", Args: json.RawMessage(`{"amount":5}`)}
	var first *jobs.Result
	for i := range 2 {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := client.PublishAndAwait(actx, j)
		cancel()
		if err != nil {
			t.Fatalf("publication %d: %v", i+1, err)
		}
		if first == nil {
			first = r
		} else if r.Key != first.Key || string(r.Output) != string(first.Output) || r.ToolUseID != "toolu_same" {
			t.Fatalf("second answer %+v differs from the first %+v", r, first)
		}
	}
}

// TestDeadLetterOfABodyNearTheMaxPayload: a job body that fits the broker
// but not with the dead letter's headers added is still dead-lettered: the
// copy omits the body, says how large it was, and points at the original,
// which stays in TOOLQ_JOBS.
func TestDeadLetterOfABodyNearTheMaxPayload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg, err := tools.NewRegistry(nil, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{})
	body := strings.Repeat("x", int(js.Conn().MaxPayload())-200)
	ack, err := js.Publish(ctx, jobs.JobSubject("pay"), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	var m *jetstream.RawStreamMsg
	testenv.Eventually(t, 10*time.Second, "the dead letter", func() bool {
		m, err = dlq.GetLastMsgForSubject(ctx, jobs.DLQSubject(jobs.DLQTooLarge))
		return err == nil
	})
	if m.Header.Get(jobs.HeaderDLQBodyOmitted) != strconv.Itoa(len(body)) || len(m.Data) != 0 ||
		m.Header.Get(jobs.HeaderDLQStreamSeq) != strconv.FormatUint(ack.Sequence, 10) {
		t.Fatalf("dead letter headers %v, %d body bytes", m.Header, len(m.Data))
	}
	jobsStream, _ := js.Stream(ctx, jobs.JobsStream)
	if orig, err := jobsStream.GetMsg(ctx, ack.Sequence); err != nil || len(orig.Data) != len(body) {
		t.Fatalf("the original is not in %s: %v", jobs.JobsStream, err)
	}
}
