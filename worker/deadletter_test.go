package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// jetStreamHeaderLimit is the largest header block a stream stores
// (nats-server refuses a longer one: "header size exceeds maximum allowed
// of 64k").
const jetStreamHeaderLimit = 65535

// headerBlock is the size of h as it goes on the wire.
func headerBlock(h nats.Header) int {
	m := nats.NewMsg("s")
	m.Header = h
	return m.Size() - len(m.Subject)
}

// largeHeaders are headers that fill a job's header block to JetStream's
// limit: one large header, or many small ones.
func largeHeaders() map[string]nats.Header {
	one := nats.Header{"X-Big": {""}}
	one["X-Big"][0] = strings.Repeat("b", jetStreamHeaderLimit-headerBlock(one))
	many := nats.Header{}
	for i := 0; headerBlock(many) < jetStreamHeaderLimit-64; i++ {
		many.Set(fmt.Sprintf("X-H-%04d", i), strings.Repeat("v", 20))
	}
	return map[string]nats.Header{"one large header": one, "many headers": many}
}

// TestJobWithHeadersAtJetStreamsLimitIsAnswered: a job whose headers fill
// JetStream's header limit (one large header, or many) ends answered. A
// valid one runs and its result is published; an invalid one is
// dead-lettered once, with toolq's headers, the original headers that fit
// and Toolq-Dlq-Headers-Omitted naming those that did not (the whole
// message stays in TOOLQ_JOBS at Toolq-Dlq-Stream-Seq).
func TestJobWithHeadersAtJetStreamsLimitIsAnswered(t *testing.T) {
	t.Parallel()
	for name, h := range largeHeaders() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
				Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
					return json.RawMessage(`{"paid":true}`), nil
				})}}, tools.Config{})
			if err != nil {
				t.Fatal(err)
			}
			js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, Logger: testLogger(t)})

			invalid := nats.NewMsg(jobs.JobSubject("pay"))
			invalid.Data = []byte(`{"version":1,"conversation_id":`)
			invalid.Header = h
			ack, err := js.PublishMsg(ctx, invalid)
			if err != nil {
				t.Fatalf("JetStream refused the job itself: %v", err)
			}

			j := &jobs.Job{Version: jobs.Version, ConversationID: "c", Tool: "pay", ToolUseID: "toolu_valid", Args: json.RawMessage(`{"n":1}`)}
			body, err := json.Marshal(j)
			if err != nil {
				t.Fatal(err)
			}
			valid := nats.NewMsg(jobs.JobSubject("pay"))
			valid.Data = body
			valid.Header = h
			if _, err := js.PublishMsg(ctx, valid); err != nil {
				t.Fatalf("JetStream refused the job itself: %v", err)
			}
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if r, err := jobs.NewClient(js).Await(actx, "c", "toolu_valid"); err != nil || r.Status != jobs.StatusOK {
				t.Fatalf("the valid job: %+v %v", r, err)
			}

			testenv.Eventually(t, 10*time.Second, "the invalid job dead-lettered", func() bool { return len(deadLetters(t, js)) > 0 })
			dl := deadLetters(t, js)
			if len(dl) != 1 {
				t.Fatalf("%d dead letters for one invalid job", len(dl))
			}
			got := dl[0].Header
			if got.Get(jobs.HeaderDLQReason) != jobs.DLQInvalid || got.Get(jobs.HeaderDLQStreamSeq) != fmt.Sprint(ack.Sequence) {
				t.Fatalf("dead letter reason %q seq %q, want %s and %d", got.Get(jobs.HeaderDLQReason), got.Get(jobs.HeaderDLQStreamSeq), jobs.DLQInvalid, ack.Sequence)
			}
			omitted := got.Get(jobs.HeaderDLQHeadersOmitted)
			if omitted == "" {
				t.Fatal("headers were dropped, and the dead letter does not say so")
			}
			for k := range h {
				if got.Get(k) == "" && !strings.Contains(omitted, k) && !strings.HasSuffix(omitted, "…") {
					t.Errorf("%s dropped silently (omitted: %.200s)", k, omitted)
				}
				if got.Get(k) != "" && strings.Contains(omitted+",", k+",") {
					t.Errorf("%s kept and said omitted", k)
				}
			}
			if name == "many headers" && len(got) < len(h)/2 {
				t.Errorf("%d of %d small headers kept: the dead letter should keep what fits", len(got), len(h))
			}
		})
	}
}

// TestDeadLetterRefusedByTheDLQIsRetriedLoudlyUntilItLands: when TOOLQ_DLQ
// refuses even the smallest dead letter (here its max message size is below
// toolq's own headers), the job is not dropped: it stays in TOOLQ_JOBS and is
// delivered again, each refusal counted in toolq.dead_letters.refused, and
// once an operator fixes the DLQ the dead letter lands.
func TestDeadLetterRefusedByTheDLQIsRetriedLoudlyUntilItLands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	dlq, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := dlq.CachedInfo().Config
	small := cfg
	small.MaxMsgSize = 64
	if _, err := js.UpdateStream(ctx, small); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, jobs.JobSubject("pay"), []byte(`not a job`)); err != nil {
		t.Fatal(err)
	}
	refused := func() int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		return sumOf(rm, "toolq.dead_letters.refused")
	}
	testenv.Eventually(t, 10*time.Second, "the refusals counted", func() bool { return refused() >= 2 })
	if n := len(deadLetters(t, js)); n != 0 {
		t.Fatalf("%d dead letters in a DLQ that refuses them", n)
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the dead letter landed once the DLQ takes it", func() bool { return len(deadLetters(t, js)) == 1 })
}

// TestDeadLetterTheDLQCannotHoldWholeLandsInItsSmallestForm: a DLQ whose
// max message size is below the original message (its body and headers
// would not fit) still takes the job's dead letter, with toolq's headers
// alone: the body and the headers are named omitted.
func TestDeadLetterTheDLQCannotHoldWholeLandsInItsSmallestForm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, Logger: testLogger(t)})
	dlq, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	small := dlq.CachedInfo().Config
	small.MaxMsgSize = 4 << 10
	if _, err := js.UpdateStream(ctx, small); err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(jobs.JobSubject("pay"))
	msg.Data = []byte(`{"not":"a job","pad":"` + strings.Repeat("x", 8<<10) + `"}`)
	msg.Header.Set("X-Pad", strings.Repeat("p", 3<<10))
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the job dead-lettered", func() bool { return len(deadLetters(t, js)) > 0 })
	dl := deadLetters(t, js)[0]
	if len(dl.Data) != 0 || dl.Header.Get(jobs.HeaderDLQBodyOmitted) != fmt.Sprint(len(msg.Data)) ||
		dl.Header.Get(jobs.HeaderDLQHeadersOmitted) != "X-Pad" || dl.Header.Get("X-Pad") != "" || dl.Header.Get(jobs.HeaderDLQReason) != jobs.DLQInvalid {
		t.Fatalf("dead letter %v with %d bytes of body, want toolq's headers alone, naming the body and X-Pad omitted", dl.Header, len(dl.Data))
	}
}

// TestDeadLetterOfAHeaderNameNatsGoWouldNotSendLands: a job published by
// another client, with header names the server stores but nats.go refuses
// to send (a space, a slash, a non-ASCII letter), is dead-lettered with the
// headers nats.go can send, the others named omitted.
func TestDeadLetterOfAHeaderNameNatsGoWouldNotSendLands(t *testing.T) {
	t.Parallel()
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, Logger: testLogger(t)})
	testenv.PublishRaw(t, js.Conn().ConnectedUrl(), jobs.JobSubject("pay"), []string{"X Space: a", "X/Slash: b", "Ünicode: c", "X-Fine: d"}, []byte(`not a job`))
	testenv.Eventually(t, 10*time.Second, "the job dead-lettered", func() bool { return len(deadLetters(t, js)) > 0 })
	h := deadLetters(t, js)[0].Header
	if h.Get("X-Fine") != "d" || h.Get(jobs.HeaderDLQHeadersOmitted) != "X Space, X/Slash, Ünicode" {
		t.Fatalf("dead letter headers %v: want X-Fine kept and the three others named omitted", h)
	}
}
