package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
	"github.com/toolq/toolq/worker"
)

// TestOperatorWorksTheDeadLetters: a payment fails until the worker gives
// up and dead-letters it; the operator lists it, fixes the downstream,
// requeues it, and it is paid once. A replay of the history afterwards
// pays nothing again.
func TestOperatorWorksTheDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := embedded.Start(ctx, embedded.Config{SandboxFaults: sandbox.Faults{ServerErrorRate: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sb, js := st.Sandbox, st.JS
	w, err := st.StartWorker(ctx, worker.Config{Consumer: worker.Consumer{MaxDeliver: 2},
		RetryDelay: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}

	nats := []string{"--nats-url", st.NATSURL}
	run := func(args ...string) (string, error) { return runPublisher(t, "", append(args, nats...)...) }
	if _, err := run("publish", "--conversation", "ops", "--turn", "1", "--tool", "send_payment", "--tool-use-id", "toolu_ops",
		"--args", `{"invoice_id":"inv_ops","amount_cents":900,"currency":"EUR"}`); err != nil {
		t.Fatal(err)
	}
	var dls []operate.DeadLetter
	testenv.Eventually(t, 20*time.Second, "the job dead-lettered", func() bool {
		out, err := run("dlq", "ls", "--json")
		if err != nil || json.Unmarshal([]byte(out), &dls) != nil {
			t.Fatalf("dlq ls: %q %v", out, err)
		}
		return len(dls) > 0
	})
	if dls[0].Reason != jobs.DLQMaxDeliver || dls[0].ToolUseID != "toolu_ops" || !strings.Contains(dls[0].Detail, "http_500") {
		t.Fatalf("dead letter %+v", dls[0])
	}
	out, err := run("dlq", "show", "1")
	if err != nil || !strings.Contains(out, "inv_ops") || !strings.Contains(out, "history:") {
		t.Fatalf("dlq show: %q %v", out, err)
	}
	if _, err := run("dlq", "purge"); err == nil || !strings.Contains(err.Error(), "--yes") {
		t.Fatalf("purge without --yes: %v", err)
	}
	sb.SetFaults(sandbox.Faults{})
	out, logs, err := runPublisherEnv(t, nil, append([]string{"dlq", "requeue", "--all", "--log-format", "json"}, nats...)...)
	if err != nil || !strings.Contains(out, "requeued as job") {
		t.Fatalf("requeue: %q %v", out, err)
	}
	// One structured line for what was done, and the progress of --all.
	if !strings.Contains(logs, `"msg":"dead letter requeued","dlq_seq":1,"job_seq":2,"reason":"max_deliver","subject":"toolq.jobs.send_payment","conversation_id":"ops","tool_use_id":"toolu_ops","by":`) || !strings.Contains(logs, "requeue: 1/1 (100%)") {
		t.Fatalf("requeue's standard error: %q", logs)
	}
	client := jobs.NewClient(js)
	actx, acancel := context.WithTimeout(ctx, 20*time.Second)
	defer acancel()
	var r *jobs.Result
	for r == nil || r.Status != jobs.StatusOK { // the failed attempts' results are not published: wait for the ok
		if r, err = client.Await(actx, "ops", "toolu_ops"); err != nil {
			t.Fatal(err)
		}
	}
	if len(sb.Payments()) != 1 {
		t.Fatalf("%d payments", len(sb.Payments()))
	}
	if out, err := run("dlq", "ls"); err != nil || strings.Contains(out, "toolu_ops") {
		t.Fatalf("dlq ls after requeue: %q %v", out, err)
	}
	out, err = run("replay", "--subject", "toolq.jobs.>", "--since", "1h", "--dry-run")
	if err != nil || !strings.Contains(out, "would replay 1 job(s)") {
		t.Fatalf("replay --dry-run: %q %v", out, err)
	}
	if out, err := run("replay", "--subject", "toolq.jobs.send_payment", "--from-seq", "1"); err != nil || !strings.Contains(out, "replayed 1 job(s)") {
		t.Fatalf("replay: %q %v", out, err)
	}
	defer func() {
		if s := w.Stats().Snapshot(); s["duplicate"] < 1 {
			t.Logf("stats %v", s)
		}
	}()
	testenv.Eventually(t, 20*time.Second, "the replay answered from the ledger", func() bool { return w.Stats().Snapshot()["duplicate"] >= 1 })
	if len(sb.Payments()) != 1 {
		t.Fatalf("the replay paid again: %d payments", len(sb.Payments()))
	}
	for _, bad := range [][]string{
		{"replay", "--subject", "toolq.jobs.>"},
		{"replay", "--subject", "elsewhere", "--from-seq", "1"},
		{"replay", "--subject", "toolq.jobs.>", "--since", "soon"},
		{"replay", "--subject", "toolq.jobs.>", "--since", "1h", "--from-seq", "1"},
		{"dlq", "show"},
		{"dlq", "show", "x"},
		{"dlq", "requeue"},
		{"dlq", "frob"},
	} {
		if _, err := run(bad...); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

// TestShowOfAnOmittedBody: dlq show says that a dead letter's body was
// omitted, how large it was, and where the original is.
func TestShowOfAnOmittedBody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, js := withStreams(t)
	job := nats.NewMsg("toolq.jobs.send_payment")
	job.Data = []byte(`{"version":1}`)
	if _, err := js.PublishMsg(ctx, job); err != nil {
		t.Fatal(err)
	}
	dl := nats.NewMsg(jobs.DLQSubject(jobs.DLQTooLarge))
	dl.Header.Set(jobs.HeaderDLQReason, jobs.DLQTooLarge)
	dl.Header.Set(jobs.HeaderDLQSubject, "toolq.jobs.send_payment")
	dl.Header.Set(jobs.HeaderDLQStreamSeq, "1")
	dl.Header.Set(jobs.HeaderDLQBodyOmitted, strconv.Itoa(len(job.Data))) // the original's size, as the worker writes it
	if _, err := js.PublishMsg(ctx, dl); err != nil {
		t.Fatal(err)
	}
	out, err := runPublisher(t, "", "dlq", "show", "1", "--nats-url", n.URL)
	if err != nil || !strings.Contains(out, "omitted (13 bytes): the original is job 1 in TOOLQ_JOBS") {
		t.Fatalf("dlq show: %q %v", out, err)
	}
	s, _ := js.Stream(ctx, jobs.JobsStream)
	if err := s.DeleteMsg(ctx, 1); err != nil {
		t.Fatal(err)
	}
	out, err = runPublisher(t, "", "dlq", "show", "1", "--nats-url", n.URL)
	if err != nil || !strings.Contains(out, "omitted (13 bytes)") || !strings.Contains(out, "no longer in TOOLQ_JOBS") {
		t.Fatalf("dlq show once the original is gone: %q %v", out, err)
	}
}

// withStreams starts a server with toolq's streams.
func withStreams(t *testing.T) (*testenv.NATS, jetstream.JetStream) {
	t.Helper()
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	if err := jobs.ProvisionStreams(context.Background(), js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	return n, js
}

func runPublisherEnv(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, cli.IO{In: strings.NewReader(""), Out: &out, Err: &errOut}, func(k string) string { return env[k] })
	return out.String(), errOut.String(), err
}

// TestRequeueRefusesWhatAPurgeMayHaveDeleted: a call dead-lettered, then
// completed by a retried turn, loses its ledger row to a purge; requeued, it
// would run again. Requeue reads the ledger's purge record and refuses a dead
// letter from before the purge's cutoff, requeues a later one, and without a
// ledger requeues with a warning.
func TestRequeueRefusesWhatAPurgeMayHaveDeleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, js := withStreams(t)
	deadLetter := func() time.Time {
		msg := nats.NewMsg(jobs.DLQSubject(jobs.DLQMaxDeliver))
		msg.Data = []byte(`{"version":1,"conversation_id":"c","turn_index":0,"tool":"send_payment","tool_use_id":"toolu_1","args":{}}`)
		msg.Header.Set(jobs.HeaderDLQReason, jobs.DLQMaxDeliver)
		msg.Header.Set(jobs.HeaderDLQSubject, "toolq.jobs.send_payment")
		ack, err := js.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := js.Stream(ctx, jobs.DLQStream)
		m, err := s.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		return m.Time
	}
	first := deadLetter()
	dir := t.TempDir()
	st, err := ledger.Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// A purge with a short retention, as an override would run it: its
	// cutoff passes the first dead letter.
	testenv.Eventually(t, 10*time.Second, "the first dead letter to be 50ms old", func() bool { return time.Since(first) > 50*time.Millisecond })
	if _, err := st.Purge(ctx, 10*time.Millisecond, 0); err != nil {
		t.Fatal(err)
	}
	deadLetter()
	env := map[string]string{"NATS_URL": n.URL, "TOOLQ_DATA_DIR": dir}
	_, _, err = runPublisherEnv(t, env, "dlq", "requeue", "1")
	if err == nil || !strings.Contains(err.Error(), "may have purged") || !strings.Contains(err.Error(), "--older-than 10ms") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("requeue of a dead letter older than the purge: %v", err)
	}
	if _, err := operate.GetDeadLetter(ctx, js, 1); err != nil {
		t.Fatalf("the refused dead letter left the DLQ: %v", err)
	}
	if out, _, err := runPublisherEnv(t, env, "dlq", "requeue", "2"); err != nil || !strings.Contains(out, "dead letter 2 requeued") {
		t.Fatalf("requeue of a dead letter after the purge: %q %v", out, err)
	}
	deadLetter()
	out, warn, err := runPublisherEnv(t, map[string]string{"NATS_URL": n.URL, "TOOLQ_DATA_DIR": t.TempDir()}, "dlq", "requeue", "3")
	if err != nil || !strings.Contains(out, "dead letter 3 requeued") || !strings.Contains(warn, "warning: no ledger") {
		t.Fatalf("requeue without a ledger: %q %q %v", out, warn, err)
	}
}

// TestAReplayThatFailsPartWayShowsWhatItPublished: TOOLQ_JOBS holds three
// jobs and takes one message more (a stream that refuses new messages
// when full): the replay publishes the first again, is refused the
// second, and says so, with the job it did publish (JSON and table), so
// that the operator replays the rest and not that one again.
func TestAReplayThatFailsPartWayShowsWhatItPublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, js := withStreams(t)
	c := jobs.NewClient(js)
	for i := range 3 {
		if _, err := c.Publish(ctx, &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: "send_payment",
			ToolUseID: fmt.Sprintf("toolu_%d", i), Args: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs, cfg.Discard = 4, jetstream.DiscardNew
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	out, err := runPublisher(t, "", "replay", "--subject", "toolq.jobs.>", "--from-seq", "1", "--json", "--nats-url", n.URL)
	var got struct {
		Jobs  []operate.Replayed `json:"jobs"`
		Error string             `json:"error"`
	}
	if jerr := json.Unmarshal([]byte(out), &got); jerr != nil || err == nil || len(got.Jobs) != 1 || got.Jobs[0].Seq != 1 ||
		got.Jobs[0].NewSeq != 4 || !strings.Contains(got.Error, "replay of 2") {
		t.Fatalf("replay --json: err %v, out %s", err, out)
	}
	cfg.MaxMsgs = 5
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	out, err = runPublisher(t, "", "replay", "--subject", "toolq.jobs.>", "--from-seq", "2", "--nats-url", n.URL)
	if err == nil || !strings.Contains(err.Error(), "stopped after the jobs above") || !strings.Contains(out, "replayed 1 job(s)") ||
		!strings.Contains(out, "toolu_1") || strings.Contains(out, "toolu_2") {
		t.Fatalf("replay: err %v, out:\n%s", err, out)
	}
}

// TestADeadLetterListingEscapesAnAgentsControlCharacters: an invalid
// job's tool_use_id is agent text; dead-lettered, `dlq ls` and `dlq show`
// print "\u001b]0;…\u0007\u001b[2J" (set the window title, clear the
// screen) escaped, not as escape sequences on the operator's terminal;
// --json keeps the text.
func TestADeadLetterListingEscapesAnAgentsControlCharacters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, js := withStreams(t)
	dl := nats.NewMsg(jobs.DLQSubject(jobs.DLQInvalid))
	dl.Data = []byte(`{"version":1,"tool_use_id":"\u001b]0;owned\u0007\u001b[2Jtoolu_x"}`)
	dl.Header.Set(jobs.HeaderDLQReason, jobs.DLQInvalid)
	dl.Header.Set(jobs.HeaderDLQDetail, "tool_use_id: invalid")
	dl.Header.Set(jobs.HeaderDLQSubject, "toolq.jobs.send_payment")
	dl.Header.Set(jobs.HeaderDLQStreamSeq, "1")
	if _, err := js.PublishMsg(ctx, dl); err != nil {
		t.Fatal(err)
	}
	out, err := runPublisher(t, "", "dlq", "ls", "--nats-url", n.URL)
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out, "\x1b\x07") {
		t.Fatalf("dlq ls printed the agent's escape sequences raw: %q", out)
	}
	if !strings.Contains(out, `\x1b]0;owned\a\x1b[2Jtoolu_x`) {
		t.Fatalf("dlq ls does not show the tool_use_id escaped: %q", out)
	}
	raw := nats.NewMsg(jobs.DLQSubject(jobs.DLQInvalid))
	raw.Data = []byte("{\"tool_use_id\":\"\x1b]0;owned\x07\x1b[2J\"}") // not JSON: invalid, dead-lettered as it came
	raw.Header.Set(jobs.HeaderDLQReason, jobs.DLQInvalid)
	raw.Header.Set(jobs.HeaderDLQDetail, "invalid character '\x1b' in string literal")
	raw.Header.Set(jobs.HeaderDLQSubject, "toolq.jobs.send_payment")
	if _, err := js.PublishMsg(ctx, raw); err != nil {
		t.Fatal(err)
	}
	out, err = runPublisher(t, "", "dlq", "show", "2", "--nats-url", n.URL)
	if err != nil || strings.ContainsAny(out, "\x1b\x07") || !strings.Contains(out, `\x1b[2J`) {
		t.Fatalf("dlq show: %q %v; want the agent's escape sequences escaped", out, err)
	}
	out, err = runPublisher(t, "", "dlq", "ls", "--json", "--nats-url", n.URL)
	var dls []operate.DeadLetter
	if err != nil || json.Unmarshal([]byte(out), &dls) != nil || len(dls) != 2 || dls[0].ToolUseID != "\x1b]0;owned\a\x1b[2Jtoolu_x" {
		t.Fatalf("dlq ls --json: %q %v; want the tool_use_id as it is", out, err)
	}
}

// TestDlqShowEscapesAByteThatIsNotUTF8: an invalid job's body is the
// agent's bytes, dead-lettered as they came. "\x9b2J" (8-bit CSI, erase
// display) is invalid UTF-8: `dlq show` prints it escaped.
func TestDlqShowEscapesAByteThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, js := withStreams(t)
	dl := nats.NewMsg(jobs.DLQSubject(jobs.DLQInvalid))
	dl.Data = []byte("\x9b2J\x9b0;owned")
	dl.Header.Set(jobs.HeaderDLQReason, jobs.DLQInvalid)
	dl.Header.Set(jobs.HeaderDLQDetail, "invalid character")
	dl.Header.Set(jobs.HeaderDLQSubject, "toolq.jobs.send_payment")
	if _, err := js.PublishMsg(ctx, dl); err != nil {
		t.Fatal(err)
	}
	out, err := runPublisher(t, "", "dlq", "show", "1", "--nats-url", n.URL)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "\x9b") {
		t.Fatalf("dlq show printed the raw C1 byte 0x9b (CSI): %q", out)
	}
}

// TestAReplayEscapesAnAgentsControlCharacters: `replay` prints each job's
// tool_use_id (read from any JSON object, valid job or not) and key (the
// Toolq-Key header of a job whose body is invalid) escaped, as `dlq ls`
// does, dry run included.
func TestAReplayEscapesAnAgentsControlCharacters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, js := withStreams(t)
	m := nats.NewMsg("toolq.jobs.send_payment")
	m.Data = []byte(`{"version":1,"tool_use_id":"\u001b]0;owned\u0007\u001b[2Jtoolu_x"}`)
	m.Header.Set(jobs.HeaderKey, "k\x1b[31mred")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	out, err := runPublisher(t, "", "replay", "--subject", "toolq.jobs.>", "--from-seq", "1", "--dry-run", "--nats-url", n.URL)
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out, "\x1b\x07") {
		t.Fatalf("replay --dry-run printed the agent's escape sequences raw: %q", out)
	}
}
