package operate_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	_, js := withStreams(t)
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
	_, js := withStreams(t, "acme")
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

// TestARequeueAfterTheJobsStreamWasMadeAgainDoesNotPublishAnotherCall: a dead
// letter whose body was omitted names its original by sequence in
// TOOLQ_JOBS. Once TOOLQ_JOBS is made again (sequences start again at 1),
// that sequence holds another call on the same subject: the requeue is
// refused with ErrOriginalGone, publishes nothing and keeps the dead letter.
func TestARequeueAfterTheJobsStreamWasMadeAgainDoesNotPublishAnotherCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := withStreams(t)
	bodyOf := func(id string) string {
		return `{"version":1,"conversation_id":"c","turn_index":0,"tool":"send_payment","tool_use_id":"` + id +
			`","args":{"memo":"` + strings.Repeat("x", 4000) + `","to":"` + id + `"}}`
	}
	pub := func(body string) uint64 {
		m := nats.NewMsg("toolq.jobs.send_payment")
		m.Data = []byte(body)
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	mine := bodyOf("toolu_mine")
	seq := pub(mine)
	dl := publishDeadLetter(t, js, jobs.DLQTooLarge, seq, "", jobs.HeaderDLQBodyOmitted, strconv.Itoa(len(mine)))

	// The operator recreates TOOLQ_JOBS (a change of storage, of replicas).
	if err := js.DeleteStream(ctx, jobs.JobsStream); err != nil {
		t.Fatal(err)
	}
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	other := bodyOf("toolu_other")
	if s := pub(other); s != seq {
		t.Fatalf("other job at %d, want %d", s, seq)
	}

	newSeq, err := operate.Requeue(ctx, js, dl)
	s, _ := js.Stream(ctx, jobs.JobsStream)
	if err == nil {
		m, gerr := s.GetMsg(ctx, newSeq)
		if gerr == nil && string(m.Data) != mine {
			_, derr := operate.GetDeadLetter(ctx, js, dl)
			t.Fatalf("requeue of dead letter %d (call toolu_mine) succeeded and published job %d with another call's body (tool_use_id %s); dead letter still there: %v",
				dl, newSeq, strings.Split(strings.Split(string(m.Data), `"tool_use_id":"`)[1], `"`)[0], derr == nil)
		}
	}
	if !errors.Is(err, operate.ErrOriginalGone) {
		t.Fatalf("requeue of dead letter %d: job %d, %v; want ErrOriginalGone", dl, newSeq, err)
	}
	if info, _ := s.Info(ctx); info.State.Msgs != 1 {
		t.Fatalf("%d jobs in %s after the refused requeue; want 1, the other call", info.State.Msgs, jobs.JobsStream)
	}
	if _, err := operate.GetDeadLetter(ctx, js, dl); err != nil {
		t.Fatalf("the dead letter after a refused requeue: %v", err)
	}
}

// TestARequeueAfterTheJobsStreamWasMadeAgainAtOnceDoesNotTakeACallOfTheSameSize:
// job 1 (toolu_A, too large, published without headers by a non-Go client)
// is dead-lettered with its body omitted. TOOLQ_JOBS is then made again
// within the minute the servers' clocks are allowed and another call,
// toolu_B, of the same size, on the same subject, is job 1 of the new
// stream: only the stream's creation after the dead letter tells it, and
// requeue refuses; taking toolu_B would delete toolu_A's dead letter.
func TestARequeueAfterTheJobsStreamWasMadeAgainAtOnceDoesNotTakeACallOfTheSameSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := withStreams(t)
	mk := func(id string) string {
		return `{"version":1,"conversation_id":"c","turn_index":0,"tool":"send_payment","tool_use_id":"` + id + `","args":{"memo":"` + strings.Repeat("x", 4000) + `"}}`
	}
	a, b := mk("toolu_A"), mk("toolu_B")
	first := nats.NewMsg("toolq.jobs.send_payment")
	first.Data = []byte(a)
	if ack, err := js.PublishMsg(ctx, first); err != nil || ack.Sequence != 1 {
		t.Fatalf("job A: %+v %v", ack, err)
	}
	dl := publishDeadLetter(t, js, jobs.DLQTooLarge, 1, "", jobs.HeaderDLQBodyOmitted, strconv.Itoa(len(a)))
	if err := js.DeleteStream(ctx, jobs.JobsStream); err != nil {
		t.Fatal(err)
	}
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	other := nats.NewMsg("toolq.jobs.send_payment")
	other.Data = []byte(b)
	if ack, err := js.PublishMsg(ctx, other); err != nil || ack.Sequence != 1 {
		t.Fatalf("job B: %+v %v", ack, err)
	}
	seq, err := operate.Requeue(ctx, js, dl)
	if errors.Is(err, operate.ErrOriginalGone) {
		return // refused: the dead letter stays
	}
	s, _ := js.Stream(ctx, jobs.JobsStream)
	var got string
	if m, gerr := s.GetMsg(ctx, seq); gerr == nil {
		got = string(m.Data)
	}
	_, dlqErr := func() (*jetstream.RawStreamMsg, error) {
		d, _ := js.Stream(ctx, jobs.DLQStream)
		return d.GetMsg(ctx, dl)
	}()
	t.Fatalf("requeue of toolu_A's dead letter (body omitted) after TOOLQ_JOBS was made again: seq %d err %v; requeued body is toolu_B's: %v; dead letter still in DLQ: %v",
		seq, err, strings.Contains(got, "toolu_B"), dlqErr == nil)
}

// barrierJS holds every PublishMsg until n of them are waiting: two
// requeues that both read the dead letter before either publishes.
type barrierJS struct {
	jetstream.JetStream
	wg *sync.WaitGroup
}

func (b barrierJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	b.wg.Done()
	b.wg.Wait()
	return b.JetStream.PublishMsg(ctx, m, opts...)
}

// TestTwoRequeuesOfOneDeadLetterAtOncePublishOneJob: two operators
// requeue the same dead letter at the same moment: TOOLQ_JOBS gets one job
// (the requeue's message id dedupes the second).
func TestTwoRequeuesOfOneDeadLetterAtOncePublishOneJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, real := withStreams(t)
	body := `{"version":1,"conversation_id":"c","turn_index":0,"tool":"send_payment","tool_use_id":"toolu_2x","args":{}}`
	dl := publishDeadLetter(t, real, jobs.DLQMaxDeliver, 7, body)
	var wg sync.WaitGroup
	wg.Add(2)
	js := barrierJS{real, &wg}
	var done sync.WaitGroup
	for i := 0; i < 2; i++ {
		done.Add(1)
		go func() {
			defer done.Done()
			seq, err := operate.Requeue(ctx, js, dl)
			t.Logf("requeue: job %d, %v", seq, err)
		}()
	}
	done.Wait()
	s, _ := real.Stream(ctx, jobs.JobsStream)
	info, _ := s.Info(ctx)
	if info.State.Msgs != 1 {
		t.Fatalf("%d jobs in %s after two requeues of dead letter %d at once; want 1", info.State.Msgs, jobs.JobsStream, dl)
	}
}

// TestAReplayListsARequeuedDeadLetter: the runbook's answer to results
// that were never published is a replay of the range, which "publishes
// their results again". A requeued dead letter carries Toolq-Replay-Of:
// dlq:N but is not a replay of a job in TOOLQ_JOBS: its original can be in
// no range (aged out), and it is the call's only job left. It is listed and
// replayed; its replay is skipped by the next replay of the range.
func TestAReplayListsARequeuedDeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, s, dl := deadLetteredJob(t)
	// The original ages out of TOOLQ_JOBS (7 days); the dead letter (30 days) is requeued.
	if err := s.DeleteMsg(ctx, 1); err != nil {
		t.Fatal(err)
	}
	newSeq, err := operate.Requeue(ctx, js, dl)
	if err != nil {
		t.Fatal(err)
	}
	got, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: newSeq, ToSeq: newSeq}, true)
	if err != nil || len(got) != 1 {
		t.Fatalf("replay of job %d, the requeued dead letter and the call's only job in %s: %d listed, err %v", newSeq, jobs.JobsStream, len(got), err)
	}
	if _, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: newSeq}, false); err != nil {
		t.Fatal(err)
	}
	again, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: newSeq}, true)
	if err != nil || len(again) != 1 || again[0].Seq != newSeq {
		t.Fatalf("the range replayed again: %+v %v; want job %d alone, its replay skipped", again, err, newSeq)
	}
}

// TestARequeueFindsAnOriginalStampedByALeaderWhoseClockIsAhead:
// TOOLQ_JOBS's leader stamps a too-large job with a clock 1.5s ahead of
// TOOLQ_DLQ's leader (R3 streams have their own leaders; NTP trouble, a VM
// resumed). The worker dead-letters it at once (too_large, first delivery,
// milliseconds later), so the dead letter's stamp is 1.5s before the
// job's. Modelled on one server by storing the dead letter first and the
// job 1.5s later at the sequence the dead letter names. The original is
// found, and the dead letter, whose body was omitted, requeued from it.
func TestARequeueFindsAnOriginalStampedByALeaderWhoseClockIsAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := withStreams(t)
	body := `{"version":1,"conversation_id":"c","turn_index":0,"tool":"send_payment","tool_use_id":"toolu_s","args":{"memo":"` + strings.Repeat("x", 4000) + `"}}`
	dl := publishDeadLetter(t, js, jobs.DLQTooLarge, 1, "", jobs.HeaderDLQBodyOmitted, strconv.Itoa(len(body)), "X-Agent", "a1")
	time.Sleep(1500 * time.Millisecond)
	job := nats.NewMsg("toolq.jobs.send_payment")
	job.Data = []byte(body)
	job.Header.Set("X-Agent", "a1")
	if ack, err := js.PublishMsg(ctx, job); err != nil || ack.Sequence != 1 {
		t.Fatalf("job: %+v %v", ack, err)
	}
	if _, err := operate.Requeue(ctx, js, dl); errors.Is(err, operate.ErrOriginalGone) {
		t.Fatalf("requeue of the dead letter of job 1, in TOOLQ_JOBS, stamped 1.5s after the dead letter by a leader's clock: %v", err)
	}
}

// TestAReplaySkipsARequeuedDeadLetterWhoseCallCameBefore: a dead letter
// requeued while its original is still in TOOLQ_JOBS is a second job of
// one call; a replay of a range that holds both publishes the original
// alone, not the call twice.
func TestAReplaySkipsARequeuedDeadLetterWhoseCallCameBefore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, _, dl := deadLetteredJob(t)
	newSeq, err := operate.Requeue(ctx, js, dl)
	if err != nil {
		t.Fatal(err)
	}
	got, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: 1, ToSeq: newSeq}, true)
	if err != nil || len(got) != 1 || got[0].Seq != 1 {
		t.Fatalf("replay of jobs 1 to %d, the original and its requeued dead letter: %+v %v; want job 1 alone", newSeq, got, err)
	}
}

// deadLetteredJob starts a server with toolq's streams and one job, of the
// call toolu_dl, at sequence 1 of TOOLQ_JOBS, dead-lettered (max_deliver)
// with its body, and returns TOOLQ_JOBS and the dead letter's sequence.
func deadLetteredJob(t *testing.T) (jetstream.JetStream, jetstream.Stream, uint64) {
	t.Helper()
	ctx := context.Background()
	_, js := withStreams(t)
	if _, err := jobs.NewClient(js).Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "send_payment", ToolUseID: "toolu_dl", Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := s.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return js, s, publishDeadLetter(t, js, jobs.DLQMaxDeliver, 1, string(orig.Data))
}
