package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/operate"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestARequeueFindsTheOriginalOfAHeaderWithATrailingSpace: a job
// published by another client (the protocol allows it; nats-py writes
// values as given) carries a header whose value ends in a space, and a
// body too large for its dead letter. The worker dead-letters it, the
// body omitted, the header copied: nats.go trims the value when it
// writes the dead letter ("hi"), but keeps the trailing space when it
// reads the original ("hi "). Requeue takes the original, still in
// TOOLQ_JOBS at the dead letter's sequence, for the original all the same.
func TestARequeueFindsTheOriginalOfAHeaderWithATrailingSpace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, header string
	}{{"no trailing space (control)", "X-Note: hi"}, {"trailing space", "X-Note: hi "}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
				Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })}}, tools.Config{})
			if err != nil {
				t.Fatal(err)
			}
			js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, Logger: testLogger(t)})
			body := []byte(`{"not":"a job","pad":"` + strings.Repeat("x", int(js.Conn().MaxPayload())-300) + `"}`)
			testenv.PublishRaw(t, js.Conn().ConnectedUrl(), jobs.JobSubject("pay"), []string{tc.header}, body)
			testenv.Eventually(t, 10*time.Second, "the job dead-lettered", func() bool { return len(deadLetters(t, js)) > 0 })
			dl := deadLetters(t, js)[0]
			if len(dl.Data) != 0 || dl.Header.Get("X-Note") == "" {
				t.Fatalf("dead letter: %d bytes of body, headers %v: want the body omitted, X-Note kept", len(dl.Data), dl.Header)
			}
			_, err = operate.Requeue(ctx, js, dl.Sequence)
			if errors.Is(err, operate.ErrOriginalGone) {
				t.Fatalf("requeue of dead letter %d, whose original is job %s in TOOLQ_JOBS: %v", dl.Sequence, dl.Header.Get(jobs.HeaderDLQStreamSeq), err)
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestARequeueRestoresOmittedHeadersBesideATrailingSpace: the same
// trailing space, on a job whose body fits its dead letter but one large
// header (X-Big) does not: requeue restores X-Big from the original in
// TOOLQ_JOBS.
func TestARequeueRestoresOmittedHeadersBesideATrailingSpace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, Logger: testLogger(t)})
	big := strings.Repeat("b", 63<<10)
	testenv.PublishRaw(t, js.Conn().ConnectedUrl(), jobs.JobSubject("pay"), []string{"X-Note: hi ", "X-Big: " + big}, []byte(`not a job`))
	testenv.Eventually(t, 10*time.Second, "the job dead-lettered", func() bool { return len(deadLetters(t, js)) > 0 })
	dl := deadLetters(t, js)[0]
	if dl.Header.Get(jobs.HeaderDLQHeadersOmitted) != "X-Big" || dl.Header.Get("X-Note") == "" || len(dl.Data) == 0 {
		t.Fatalf("dead letter %v, %d bytes of body: want X-Big omitted, X-Note and the body kept", dl.Header.Get(jobs.HeaderDLQHeadersOmitted), len(dl.Data))
	}
	seq, err := operate.Requeue(ctx, js, dl.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, jobs.JobsStream)
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get("X-Big") != big {
		t.Fatalf("requeued job %d has X-Big of %d bytes, want the original's %d: the original is job %s in TOOLQ_JOBS", seq, len(m.Header.Get("X-Big")), len(big), dl.Header.Get(jobs.HeaderDLQStreamSeq))
	}
}
