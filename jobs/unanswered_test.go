package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// TestAnAgentsTurnOutlivesUnansweredJetStreamRequests: in a cluster that
// has just lost a node, a JetStream request can go unanswered though the
// next is answered at once. RunTurn asks for the results stream's last
// sequence and creates a consumer to read its results; each request whose
// answer is lost is asked again, and the turn comes back long before the
// agent's deadline of a minute, with its call run once.
func TestAnAgentsTurnOutlivesUnansweredJetStreamRequests(t *testing.T) {
	defer jsretry.SetPatience(300 * time.Millisecond)()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := startStack(ctx, t)
	lossy := testenv.LoseJetStreamAnswers(t, st.Conn, func(api string, nth int) bool {
		return nth == 1 && (api == "STREAM.INFO" || api == "CONSUMER.CREATE")
	})
	began := time.Now()
	got, err := jobs.NewClient(lossy).RunTurn(ctx, "conv-unanswered", 1, []jobs.ToolCall{payment("toolu_1", "inv_unanswered")})
	took := time.Since(began)
	if err != nil || len(got) != 1 || got[0].IsError {
		t.Fatalf("the turn after lost answers: %+v %v (after %v)", got, err, took)
	}
	if took > 20*time.Second {
		t.Fatalf("the turn took %v: it waited for an answer that was lost", took)
	}
	if lossy.Asked("STREAM.INFO.") < 2 || lossy.Asked("CONSUMER.CREATE.") < 2 {
		t.Fatalf("the lost requests were not asked again: %d stream infos, %d consumer creates",
			lossy.Asked("STREAM.INFO."), lossy.Asked("CONSUMER.CREATE."))
	}
	if n := len(st.Sandbox.Payments()); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}
