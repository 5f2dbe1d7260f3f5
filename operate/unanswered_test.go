package operate_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/operate"
)

// TestOperatorsCommandsOutliveUnansweredJetStreamRequests: a replay, a
// dead letter's reading and a count of the DLQ, each run with a deadline
// of a minute against a JetStream that loses the first answer to every
// kind of request it is asked (a cluster that has just lost a node): each
// request is asked again after its patience, and every command finishes
// long before its deadline with what it would have found.
func TestOperatorsCommandsOutliveUnansweredJetStreamRequests(t *testing.T) {
	defer jsretry.SetPatience(300 * time.Millisecond)()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := testenv.StartNATS(t)
	direct, _ := jetstream.New(n.Connect())
	if err := jobs.ProvisionStreams(ctx, direct, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	c := jobs.NewClient(direct)
	for i := range 3 {
		if _, err := c.Publish(ctx, &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: "send_payment", ToolUseID: "toolu_" + strconv.Itoa(i), Args: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	dead := publishDeadLetter(t, direct, jobs.DLQMaxDeliver, 1, `{"tool_use_id":"toolu_0"}`)

	fresh := func() *testenv.LossyJetStream {
		return testenv.LoseJetStreamAnswers(t, n.Connect(), func(_ string, nth int) bool { return nth == 1 })
	}
	began := time.Now()
	js := fresh()
	replayed, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: 1}, false)
	if err != nil || len(replayed) != 3 || replayed[2].NewSeq != 6 {
		t.Fatalf("the replay: %+v %v (after %v)", replayed, err, time.Since(began))
	}
	if js.Asked("STREAM.INFO.") < 2 || js.Asked("CONSUMER.INFO.") < 2 {
		t.Fatalf("lost answers not asked again: %d stream infos, %d consumer infos", js.Asked("STREAM.INFO."), js.Asked("CONSUMER.INFO."))
	}
	if d, err := operate.GetDeadLetter(ctx, fresh(), dead); err != nil || d.ToolUseID != "toolu_0" {
		t.Fatalf("the dead letter: %+v %v", d, err)
	}
	if count, err := operate.CountDeadLetters(ctx, fresh(), ""); err != nil || count.N != 1 {
		t.Fatalf("the count: %+v %v", count, err)
	}
	if comebacks, err := operate.Comebacks(ctx, fresh()); err != nil || len(comebacks) == 0 {
		t.Fatalf("the streams' settings: %+v %v", comebacks, err)
	}
	if took := time.Since(began); took > 30*time.Second {
		t.Fatalf("the commands took %v: they waited for answers that were lost", took)
	}
	s, _ := direct.Stream(ctx, jobs.JobsStream)
	if msgs := s.CachedInfo().State.Msgs; msgs != 6 {
		t.Fatalf("TOOLQ_JOBS holds %d messages after the replay of 3, want 6", msgs)
	}
}
