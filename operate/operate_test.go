package operate_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
)

func TestReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := withStreams(t)
	c := jobs.NewClient(js)
	start := time.Now()
	for i, tool := range []string{"send_payment", "create_ticket", "send_payment"} {
		if _, err := c.Publish(ctx, &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: tool, ToolUseID: "toolu_" + strconv.Itoa(i), Args: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	dry, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobSubject("send_payment"), FromSeq: 1}, true)
	if err != nil || len(dry) != 2 || dry[0].Seq != 1 || dry[1].Seq != 3 || dry[0].NewSeq != 0 || dry[0].ToolUseID != "toolu_0" || dry[0].Key == "" {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	done, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, Since: start.Add(-time.Minute)}, false)
	if err != nil || len(done) != 3 || done[0].NewSeq != 4 {
		t.Fatalf("replay: %+v %v", done, err)
	}
	s, _ := js.Stream(ctx, jobs.JobsStream)
	m, err := s.GetMsg(ctx, 4)
	if err != nil || m.Header.Get(jobs.HeaderReplayOf) != "1" || m.Header.Get(jobs.HeaderKey) != done[0].Key || m.Subject != "toolq.jobs.send_payment" {
		t.Fatalf("replayed message %+v %v", m, err)
	}
	// Replaying the same range again skips the replays: it does not grow.
	again, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: 1}, false)
	if err != nil || len(again) != 3 {
		t.Fatalf("second replay: %+v %v", again, err)
	}
	// A sequence range stops where it is told.
	part, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: 2, ToSeq: 2}, true)
	if err != nil || len(part) != 1 || part[0].Seq != 2 {
		t.Fatalf("range: %+v %v", part, err)
	}
	for _, bad := range []operate.ReplayRange{
		{Subject: "other.subject", FromSeq: 1},
		{Subject: jobs.JobsSubjects},
		{Subject: jobs.JobsSubjects, FromSeq: 1, Since: start},
		{Subject: jobs.JobsSubjects, FromSeq: 5, ToSeq: 2},
	} {
		if _, err := operate.Replay(ctx, js, bad, true); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// TestReplayConsultsTheLedger: with the ledger, each replayed job says what
// the ledger knows of its key and so what its replay will do; a dry run and
// a real one say the same.
func TestReplayConsultsTheLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := withStreams(t)
	st, err := ledger.OpenSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c := jobs.NewClient(js)
	settle := []func(ledger.Fence) error{
		func(f ledger.Fence) error { return st.Complete(ctx, f, json.RawMessage(`{}`)) },
		func(f ledger.Fence) error { return st.Fail(ctx, f, ledger.ErrorInfo{Code: "declined"}) },
		func(f ledger.Fence) error { return st.MarkIndeterminate(ctx, f, ledger.ErrorInfo{Code: "reset"}) },
		func(ledger.Fence) error { return nil }, // in flight
		nil,                                     // no row
	}
	for i, s := range settle {
		j := &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: "send_payment", ToolUseID: "toolu_" + strconv.Itoa(i), Args: json.RawMessage(`{}`)}
		if _, err := c.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
		if s == nil {
			continue
		}
		key, _ := j.Key()
		res, err := st.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: "c", TurnIndex: int64(i), Tool: "send_payment",
			ArgsDigest: mustDigest(t, j), ToolUseID: j.ToolUseID, Owner: "t", Lease: time.Hour}})
		if err != nil || !res[0].Claimed {
			t.Fatalf("claim: %v %+v", err, res)
		}
		if err := s(res[0].Row.Fence()); err != nil {
			t.Fatal(err)
		}
	}
	// The no-row call again, with another tool_use_id: it runs once.
	if _, err := c.Publish(ctx, &jobs.Job{ConversationID: "c", TurnIndex: 4, Tool: "send_payment", ToolUseID: "toolu_again", Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	want := []operate.Outcome{operate.Answered, operate.Answered, operate.NeedOperator, operate.Waits, operate.RunsNow, operate.Answered}
	wantLedger := []string{"completed", "failed", "indeterminate", "in_flight", "none", "none"}
	var progress []uint64
	r := operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: 1}
	dry, err := operate.Replay(ctx, js, r, true, operate.WithLedger(st), operate.WithProgress(func(done, total uint64) {
		progress = append(progress, done, total)
	}))
	if err != nil || len(dry) != len(want) {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	if len(progress) != 2*len(want) || progress[len(progress)-2] != 6 || progress[len(progress)-1] != 6 {
		t.Errorf("progress %v", progress)
	}
	real, err := operate.Replay(ctx, js, r, false, operate.WithLedger(st))
	if err != nil || len(real) != len(want) {
		t.Fatalf("replay: %+v %v", real, err)
	}
	for i := range want {
		if dry[i].Outcome != want[i] || dry[i].Ledger != wantLedger[i] || real[i].Outcome != dry[i].Outcome || real[i].NewSeq == 0 {
			t.Errorf("job %d: dry %+v, real %+v, want %s (%s)", i, dry[i], real[i], want[i], wantLedger[i])
		}
	}
	if got := operate.Summary(dry); got[operate.Answered] != 3 || got[operate.RunsNow] != 1 || got[operate.Waits] != 1 || got[operate.NeedOperator] != 1 {
		t.Errorf("summary %v", got)
	}
	blind, err := operate.Replay(ctx, js, r, true)
	if err != nil || blind[0].Outcome != operate.Unknown || blind[0].Ledger != "" {
		t.Fatalf("without the ledger: %+v %v", blind, err)
	}
}

func mustDigest(t *testing.T, j *jobs.Job) string {
	t.Helper()
	m, err := j.Call().Material()
	if err != nil {
		t.Fatal(err)
	}
	return m.ArgsDigest()
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := withStreams(t)
	body := `{"version":1,"conversation_id":"c","turn_index":0,"tool":"send_payment","tool_use_id":"toolu_dead","args":{}}`
	for i, reason := range []string{jobs.DLQMaxDeliver, jobs.DLQInvalid} {
		msg := nats.NewMsg(jobs.DLQSubject(reason))
		msg.Data = []byte(body)
		msg.Header.Set("X-Agent", "a1")
		msg.Header.Set(jobs.HeaderDLQReason, reason)
		msg.Header.Set(jobs.HeaderDLQDetail, "gave up")
		msg.Header.Set(jobs.HeaderDLQSubject, "toolq.jobs.send_payment")
		msg.Header.Set(jobs.HeaderDLQStreamSeq, strconv.Itoa(40+i))
		msg.Header.Set(jobs.HeaderDLQDeliveries, "10")
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	all, err := operate.ListDeadLetters(ctx, js, "")
	if err != nil || len(all) != 2 {
		t.Fatalf("list: %+v %v", all, err)
	}
	d := all[0]
	if d.Seq != 1 || d.Reason != jobs.DLQMaxDeliver || d.JobSeq != 40 || d.Deliveries != 10 || d.ToolUseID != "toolu_dead" ||
		d.Header.Get("X-Agent") != "a1" || d.Header.Get(jobs.HeaderDLQReason) != "" || d.Body != body {
		t.Fatalf("dead letter %+v", d)
	}
	if only, _ := operate.ListDeadLetters(ctx, js, jobs.DLQInvalid); len(only) != 1 || only[0].Seq != 2 {
		t.Fatalf("by reason: %+v", only)
	}
	newSeq, err := operate.Requeue(ctx, js, 1)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, jobs.JobsStream)
	m, err := s.GetMsg(ctx, newSeq)
	if err != nil || string(m.Data) != body || m.Header.Get(jobs.HeaderReplayOf) != "dlq:1" || m.Header.Get("X-Agent") != "a1" || m.Subject != "toolq.jobs.send_payment" {
		t.Fatalf("requeued %+v %v", m, err)
	}
	if _, err := operate.GetDeadLetter(ctx, js, 1); err == nil {
		t.Fatal("a requeued dead letter stayed in the DLQ")
	}
	if _, err := operate.Requeue(ctx, js, 1); err == nil {
		t.Fatal("requeued twice")
	}
	if _, err := operate.Requeue(ctx, js, 2, operate.PurgedBefore(time.Now().Add(time.Minute))); !errors.Is(err, operate.ErrRowMayBePurged) {
		t.Fatalf("requeue of a dead letter from before the purge cutoff: %v", err)
	}
	c, err := operate.CountDeadLetters(ctx, js, "")
	if err != nil || c.N != 1 {
		t.Fatalf("count: %+v %v", c, err)
	}
	if err := operate.PurgeDeadLetters(ctx, js, c); err != nil {
		t.Fatal(err)
	}
	if left, _ := operate.ListDeadLetters(ctx, js, ""); len(left) != 0 {
		t.Fatalf("after purge: %+v", left)
	}
}

// publishDeadLetter publishes a dead letter of reason for the job at jobSeq,
// as the worker does, and returns its sequence in TOOLQ_DLQ.
func publishDeadLetter(t *testing.T, js jetstream.JetStream, reason string, jobSeq uint64, body string, set ...string) uint64 {
	t.Helper()
	msg := nats.NewMsg(jobs.DLQSubject(reason))
	msg.Data = []byte(body)
	msg.Header.Set(jobs.HeaderDLQReason, reason)
	msg.Header.Set(jobs.HeaderDLQDetail, "gave up")
	msg.Header.Set(jobs.HeaderDLQSubject, "toolq.jobs.send_payment")
	msg.Header.Set(jobs.HeaderDLQStreamSeq, strconv.FormatUint(jobSeq, 10))
	for i := 0; i+1 < len(set); i += 2 {
		msg.Header.Set(set[i], set[i+1])
	}
	ack, err := js.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// TestPurgeKeepsWhatArrivedAfterTheCount: a dead letter that arrives
// between the count an operator was shown and the purge is not deleted.
func TestPurgeKeepsWhatArrivedAfterTheCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := withStreams(t)
	publishDeadLetter(t, js, jobs.DLQMaxDeliver, 1, "{}")
	publishDeadLetter(t, js, jobs.DLQInvalid, 2, "{}")
	c, err := operate.CountDeadLetters(ctx, js, jobs.DLQMaxDeliver)
	if err != nil || c.N != 1 || c.Through != 2 {
		t.Fatalf("count: %+v %v", c, err)
	}
	late := publishDeadLetter(t, js, jobs.DLQMaxDeliver, 3, "{}")
	if err := operate.PurgeDeadLetters(ctx, js, c); err != nil {
		t.Fatal(err)
	}
	left, err := operate.ListDeadLetters(ctx, js, "")
	if err != nil || len(left) != 2 || left[0].Seq != 2 || left[1].Seq != late {
		t.Fatalf("left after the purge: %+v %v (want the invalid one and the late one, %d)", left, err, late)
	}
	if empty, err := operate.CountDeadLetters(ctx, js, "nothing_here"); err != nil || empty.N != 0 {
		t.Fatalf("count of a reason with none: %+v %v", empty, err)
	}
}

// TestRequeueOfAnOmittedBody: a dead letter whose body did not fit in the
// DLQ is requeued with the original's body and headers, read from
// TOOLQ_JOBS; once the original is gone from there, it is refused and stays.
func TestRequeueOfAnOmittedBody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := withStreams(t)
	body := `{"version":1,"conversation_id":"c","turn_index":0,"tool":"send_payment","tool_use_id":"toolu_big","args":{"memo":"` +
		strings.Repeat("x", 4000) + `"}}`
	job := nats.NewMsg("toolq.jobs.send_payment")
	job.Data = []byte(body)
	job.Header.Set(jobs.HeaderKey, "k-big")
	job.Header.Set("X-Agent", "a1")
	ack, err := js.PublishMsg(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	omitted := func() uint64 {
		return publishDeadLetter(t, js, jobs.DLQTooLarge, ack.Sequence, "", jobs.HeaderDLQBodyOmitted, strconv.Itoa(len(body)))
	}
	dl := omitted()
	d, err := operate.GetDeadLetter(ctx, js, dl)
	if err != nil || d.Body != "" || d.Header.Get(jobs.HeaderDLQBodyOmitted) != "" {
		t.Fatalf("dead letter %+v %v", d, err)
	}
	newSeq, err := operate.Requeue(ctx, js, dl)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, jobs.JobsStream)
	m, err := s.GetMsg(ctx, newSeq)
	if err != nil || string(m.Data) != body || m.Header.Get(jobs.HeaderKey) != "k-big" || m.Header.Get("X-Agent") != "a1" ||
		m.Header.Get(jobs.HeaderReplayOf) != "dlq:"+strconv.FormatUint(dl, 10) || m.Subject != "toolq.jobs.send_payment" {
		t.Fatalf("requeued %+v %v", m, err)
	}
	// The original ages out of TOOLQ_JOBS: the dead letter cannot be requeued.
	gone := omitted()
	if err := s.DeleteMsg(ctx, ack.Sequence); err != nil {
		t.Fatal(err)
	}
	_, err = operate.Requeue(ctx, js, gone)
	if err == nil || !strings.Contains(err.Error(), "omitted") || !strings.Contains(err.Error(), "no longer in "+jobs.JobsStream) {
		t.Fatalf("requeue of an omitted body whose original is gone: %v", err)
	}
	if _, err := operate.GetDeadLetter(ctx, js, gone); err != nil {
		t.Fatalf("the refused dead letter left the DLQ: %v", err)
	}
}

func TestCheckRetention(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	jobsAge := operate.Comeback{Stream: jobs.JobsStream, Setting: "max age", Age: 7 * day, Risk: "replay"}
	dlqAge := operate.Comeback{Stream: jobs.DLQStream, Setting: "max age", Age: 30 * day, Risk: "requeue"}
	window := operate.Comeback{Stream: jobs.JobsStream, Setting: "duplicate window", Age: 2 * time.Minute, Risk: "dup"}
	forever := operate.Comeback{Stream: jobs.DLQStream, Setting: "max age", Risk: "requeue"}
	for _, c := range []struct {
		retention time.Duration
		cs        []operate.Comeback
		want      string // the error; empty: nil
	}{
		{31 * day, []operate.Comeback{jobsAge, dlqAge, window}, ""},
		{8 * day, []operate.Comeback{jobsAge, dlqAge, window}, "operate: a retention of 8d is not longer than TOOLQ_DLQ's max age 30d: requeue"},
		{30 * day, []operate.Comeback{jobsAge, dlqAge, window}, "operate: a retention of 30d is not longer than TOOLQ_DLQ's max age 30d: requeue"},
		{36 * time.Hour, []operate.Comeback{dlqAge, jobsAge}, "operate: a retention of 1d12h is not longer than TOOLQ_DLQ's max age 30d: requeue"},
		{time.Minute, []operate.Comeback{window}, "operate: a retention of 1m is not longer than TOOLQ_JOBS's duplicate window 2m: dup"},
		{400 * day, []operate.Comeback{jobsAge, forever}, "operate: a retention of 400d is not longer than TOOLQ_DLQ's max age (none: it keeps messages until they are deleted): requeue"},
		{31 * day, nil, ""},
	} {
		err := operate.CheckRetention(c.retention, c.cs)
		if (err == nil) != (c.want == "") || err != nil && err.Error() != c.want {
			t.Errorf("CheckRetention(%v): %v, want %q", c.retention, err, c.want)
		}
	}
}
