package operate_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

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
	n, direct := withStreams(t)
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
	if js.Asked("STREAM.INFO.") < 2 || js.Asked("CONSUMER.CREATE.") < 3 || js.Asked("CONSUMER.MSG.NEXT.") < 2 {
		t.Fatalf("lost answers not asked again: %d stream infos, %d consumer creates, %d batches",
			js.Asked("STREAM.INFO."), js.Asked("CONSUMER.CREATE."), js.Asked("CONSUMER.MSG.NEXT."))
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

// TestAScanWhoseBatchWasLostKeepsTheCallersDeadlineAndPatience: a listing
// of the dead letters whose first batch is lost on its way reads on with a
// consumer of its own. When the answers to that consumer's creation are
// lost too, the listing ends with the caller's deadline (it used to wait
// on, re-creating without a deadline); when only the first is lost, it is
// asked again after the patience, not JetStream's 10s, and every dead
// letter is listed once, in order.
func TestAScanWhoseBatchWasLostKeepsTheCallersDeadlineAndPatience(t *testing.T) {
	defer jsretry.SetPatience(300 * time.Millisecond)()
	n, direct := withDeadLetters(t, 300) // more than one batch
	var want []string
	for i := range 300 {
		want = append(want, "toolu_"+strconv.Itoa(i+1))
	}
	firstBatchLost := func(api string, nth int) bool { return api == "CONSUMER.MSG" && nth == 1 }

	t.Run("every re-creation unanswered", func(t *testing.T) {
		js := testenv.LoseJetStreamAnswers(t, n.Connect(), func(api string, nth int) bool {
			return firstBatchLost(api, nth) || (api == "CONSUMER.CREATE" && nth >= 2)
		})
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		began := time.Now()
		got, err := operate.ListDeadLetters(ctx, js, "")
		took := time.Since(began)
		if err == nil {
			t.Fatalf("listed %d dead letters though no consumer to read on with was ever confirmed", len(got))
		}
		if took > 5*time.Second {
			t.Fatalf("the listing with a 3s deadline returned after %v: %v", took, err)
		}
		t.Logf("after %v: %v", took.Round(time.Millisecond), err)
	})
	t.Run("one re-creation unanswered", func(t *testing.T) {
		js := testenv.LoseJetStreamAnswers(t, n.Connect(), func(api string, nth int) bool {
			return firstBatchLost(api, nth) || (api == "CONSUMER.CREATE" && nth == 2)
		})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		began := time.Now()
		got, err := operate.ListDeadLetters(ctx, js, "")
		took := time.Since(began)
		if err != nil {
			t.Fatalf("after %v: %v", took, err)
		}
		var ids []string
		for _, d := range got {
			ids = append(ids, d.ToolUseID)
		}
		if !slices.Equal(ids, want) {
			t.Fatalf("listed %d dead letters, want the %d published, once each in order: %v", len(ids), len(want), ids)
		}
		if took > 8*time.Second {
			t.Fatalf("the listing took %v: a lost answer waited for more than its patience", took)
		}
		left := 0
		s, _ := direct.Stream(context.Background(), jobs.DLQStream)
		for range s.ConsumerNames(context.Background()).Name() {
			left++
		}
		if left != 0 {
			t.Fatalf("the scan left %d consumer(s) on %s", left, jobs.DLQStream)
		}
	})
}
