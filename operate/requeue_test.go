package operate_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/operate"
)

// TestRequeueOfOmittedHeadersRestoresThem: a dead letter that could not
// carry all of the original's headers (Toolq-Dlq-Headers-Omitted) is
// requeued from its original in TOOLQ_JOBS, with every header; once the
// original is gone, from the dead letter itself, with the headers it kept
// (its body is whole).
func TestRequeueOfOmittedHeadersRestoresThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	body := `{"version":1,"conversation_id":"c","turn_index":0,"tool":"send_payment","tool_use_id":"toolu_h","args":{}}`
	job := nats.NewMsg("toolq.jobs.send_payment")
	job.Data = []byte(body)
	job.Header.Set("X-Agent", "a1")
	job.Header.Set("X-Big", "b")
	ack, err := js.PublishMsg(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	deadLetter := func() uint64 {
		return publishDeadLetter(t, js, jobs.DLQInvalid, ack.Sequence, body, "X-Agent", "a1", jobs.HeaderDLQHeadersOmitted, "X-Big")
	}
	requeued := func(dl uint64) *jetstream.RawStreamMsg {
		t.Helper()
		seq, err := operate.Requeue(ctx, js, dl)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := js.Stream(ctx, jobs.JobsStream)
		m, err := s.GetMsg(ctx, seq)
		if err != nil || string(m.Data) != body || m.Header.Get("X-Agent") != "a1" || m.Header.Get(jobs.HeaderReplayOf) != "dlq:"+strconv.FormatUint(dl, 10) {
			t.Fatalf("requeued %+v %v", m, err)
		}
		return m
	}
	if m := requeued(deadLetter()); m.Header.Get("X-Big") != "b" {
		t.Fatalf("requeued without the omitted header: %v", m.Header)
	}
	s, _ := js.Stream(ctx, jobs.JobsStream)
	if err := s.DeleteMsg(ctx, ack.Sequence); err != nil {
		t.Fatal(err)
	}
	if m := requeued(deadLetter()); m.Header.Get("X-Big") != "" || m.Header.Get(jobs.HeaderDLQHeadersOmitted) != "" {
		t.Fatalf("requeued from the dead letter: %v", m.Header)
	}
}

// TestATenantCannotMakeARequeueLoseADeadLetter: tenants share TOOLQ_JOBS
// and its duplicate window, and a requeue's Nats-Msg-Id is
// requeue:dlq:<seq>, a sequence anyone can guess. A tenant that published
// on its own subject with those ids must not make an operator's requeue of
// the default tenant's dead letter a dropped duplicate that still removes
// the dead letter: the job is either back in TOOLQ_JOBS or still a dead
// letter.
func TestATenantCannotMakeARequeueLoseADeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{Tenants: []string{"acme"}}); err != nil {
		t.Fatal(err)
	}
	// Acme, on its own subject, takes the ids of the next requeues.
	for seq := 1; seq <= 5; seq++ {
		m := nats.NewMsg(jobs.TenantJobSubject("acme", "pay"))
		m.Data = []byte(`{}`)
		m.Header.Set("Nats-Msg-Id", "requeue:dlq:"+strconv.Itoa(seq))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	body := `{"version":1,"conversation_id":"c","turn_index":0,"tool":"send_payment","tool_use_id":"toolu_d","args":{}}`
	job := nats.NewMsg("toolq.jobs.send_payment")
	job.Data = []byte(body)
	ack, err := js.PublishMsg(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	dl := publishDeadLetter(t, js, jobs.DLQInvalid, ack.Sequence, body)
	newSeq, err := operate.Requeue(ctx, js, dl)
	if err != nil {
		t.Logf("requeue: %v", err) // refusing is fine; losing is not
	}
	jobsStream, _ := js.Stream(ctx, jobs.JobsStream)
	requeued, gerr := jobsStream.GetMsg(ctx, newSeq)
	back := err == nil && gerr == nil && requeued.Subject == "toolq.jobs.send_payment" && string(requeued.Data) == body
	dlq, _ := js.Stream(ctx, jobs.DLQStream)
	_, derr := dlq.GetMsg(ctx, dl)
	if !back && derr != nil {
		got := "nothing"
		if gerr == nil {
			got = requeued.Subject + " " + string(requeued.Data)
		}
		t.Fatalf("dead letter %d removed, and the job was not requeued: Requeue returned seq %d, which is %s", dl, newSeq, got)
	}
}
