package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
	"github.com/toolq/toolq/worker"
)

type replayOut struct {
	DryRun          bool                    `json:"dry_run"`
	LedgerConsulted bool                    `json:"ledger_consulted"`
	Jobs            []operate.Replayed      `json:"jobs"`
	Summary         map[operate.Outcome]int `json:"summary"`
}

type statusOut struct {
	Consumers []struct {
		Name    string
		Pending uint64
	}
	DeadLetters map[string]uint64 `json:"dead_letters"`
	Ledger      map[string]int64
	Oldest      *struct{ Key string } `json:"oldest_in_flight"`
}

// TestOperatorAt3AM: a replay of processed payments takes no effect, and
// its dry run and real run agree that every job is answered from the
// ledger. An indeterminate ticket resolved as not run is run exactly once by
// a replay, and its row keeps the resolution. status counts what the test
// made, and shows no ephemeral consumer of the replays.
func TestOperatorAt3AM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w, err := st.StartWorker(ctx, worker.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	sb, client := st.Sandbox, jobs.NewClient(st.JS)
	flags := []string{"--nats-url", st.NATSURL, "--data-dir", st.Dir}
	run := func(args ...string) (string, error) { return runPublisher(t, "", append(args, flags...)...) }
	await := func(j *jobs.Job) *jobs.Result {
		t.Helper()
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		r, err := client.PublishAndAwait(actx, j)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for i, inv := range []string{"inv_a", "inv_b", "inv_c"} {
		await(&jobs.Job{ConversationID: "night", TurnIndex: int64(i), Tool: "send_payment", ToolUseID: "toolu_" + inv,
			Args: json.RawMessage(`{"invoice_id":"` + inv + `","amount_cents":100,"currency":"EUR"}`)})
	}
	if n := len(sb.Payments()); n != 3 {
		t.Fatalf("%d payments", n)
	}

	replay := func(args ...string) replayOut {
		t.Helper()
		out, err := run(append([]string{"replay", "--subject", "toolq.jobs.send_payment", "--from-seq", "1", "--json"}, args...)...)
		var r replayOut
		if err != nil || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("replay %v: %q %v", args, out, err)
		}
		return r
	}
	dry, real := replay("--dry-run"), replay()
	if !dry.LedgerConsulted || len(dry.Jobs) != 3 || len(real.Jobs) != 3 || dry.Summary[operate.Answered] != 3 || real.Summary[operate.Answered] != 3 {
		t.Fatalf("dry %+v\nreal %+v", dry, real)
	}
	for i := range dry.Jobs {
		if dry.Jobs[i].Outcome != operate.Answered || real.Jobs[i].Outcome != operate.Answered || dry.Jobs[i].Ledger != "completed" {
			t.Errorf("job %d: dry %+v real %+v", i, dry.Jobs[i], real.Jobs[i])
		}
	}
	waitFor(t, "the replays answered from the ledger", func() bool { return w.Stats().Snapshot()["duplicate"] >= 3 })
	if n := len(sb.Payments()); n != 3 {
		t.Fatalf("the replay paid again: %d payments", n)
	}
	out, err := run("replay", "--subject", "toolq.jobs.send_payment", "--from-seq", "1", "--dry-run", "--data-dir", "")
	if err != nil || !strings.Contains(out, "would replay 3 job(s)") {
		t.Fatalf("dry run: %q %v", out, err)
	}
	if out, err := runPublisher(t, "", "replay", "--subject", "toolq.jobs.send_payment", "--from-seq", "1", "--dry-run", "--nats-url", st.NATSURL); err != nil ||
		!strings.Contains(out, "the ledger was not consulted") {
		t.Fatalf("dry run without the ledger: %q %v", out, err)
	}

	// A ticket whose answer was lost after it was made: indeterminate.
	sb.SetFaults(sandbox.Faults{DropAfterEffectRate: 1})
	ticket := &jobs.Job{ConversationID: "night", TurnIndex: 9, Tool: "create_ticket", ToolUseID: "toolu_ticket",
		Args: json.RawMessage(`{"title":"refund","body":"b"}`)}
	if r := await(ticket); r.Status != jobs.StatusIndeterminate {
		t.Fatalf("ticket %+v", r)
	}
	sb.SetFaults(sandbox.Faults{})
	key, _ := ticket.Key()
	// An invalid job, dead-lettered.
	if _, err := st.JS.PublishMsg(ctx, &nats.Msg{Subject: "toolq.jobs.send_payment", Data: []byte("{not json")}); err != nil {
		t.Fatal(err)
	}
	var s statusOut
	waitFor(t, "status to count the dead letter and the indeterminate row", func() bool {
		out, err := run("status", "--json")
		if err != nil || json.Unmarshal([]byte(out), &s) != nil {
			t.Fatalf("status: %q %v", out, err)
		}
		return s.DeadLetters[jobs.DLQInvalid] == 1 && s.Ledger["indeterminate"] == 1 && len(s.Consumers) == 1 && s.Consumers[0].Pending == 0
	})
	if s.Consumers[0].Name != "toolq" || s.Ledger["completed"] != 3 || s.Ledger["stale"] != 0 || s.Ledger["in_flight"] != 0 ||
		s.DeadLetters[jobs.DLQMaxDeliver] != 0 || s.Oldest != nil {
		t.Fatalf("status %+v", s)
	}
	out, err = run("status")
	if err != nil || !strings.Contains(out, "DEAD LETTERS") || strings.Count(out, "\ntoolq ") != 1 {
		t.Fatalf("status table: %q %v", out, err)
	}

	tdry := replay("--subject", "toolq.jobs.create_ticket", "--dry-run")
	if len(tdry.Jobs) != 1 || tdry.Jobs[0].Outcome != operate.NeedOperator {
		t.Fatalf("dry run of the indeterminate ticket: %+v", tdry)
	}
	if _, err := st.Store.Resolve(ctx, key, ledger.Resolution{NotRun: true, By: "oncall", Reason: "no ticket refund in the tracker"}); err != nil {
		t.Fatal(err)
	}
	tickets := len(sb.Tickets())
	if r := replay("--subject", "toolq.jobs.create_ticket"); len(r.Jobs) != 1 || r.Jobs[0].Outcome != operate.RunsNow {
		t.Fatalf("replay of the resolved ticket: %+v", r)
	}
	waitFor(t, "the ticket made again", func() bool {
		row, err := st.Store.Get(ctx, key)
		return err == nil && row.State == ledger.Completed
	})
	if n := len(sb.Tickets()); n != tickets+1 {
		t.Fatalf("the replay made %d tickets, want 1", n-tickets)
	}
	row, _ := st.Store.Get(ctx, key)
	if ev := row.LastResolution(); ev == nil || ev.By != "oncall" || ev.Decision != ledger.DecisionNotRun {
		t.Fatalf("history %+v", row.History)
	}
	if r := replay("--subject", "toolq.jobs.create_ticket", "--dry-run"); r.Jobs[0].Outcome != operate.Answered {
		t.Fatalf("after the rerun: %+v", r)
	}

	// A holder that died: its row is stale, and the oldest in-flight lease.
	res, err := st.Store.Claim(ctx, []ledger.Claim{{Key: "k-dead-holder", ConversationID: "night", Tool: "send_payment", ArgsDigest: "d",
		ToolUseID: "toolu_dead", Owner: "host-7", Lease: time.Millisecond}})
	if err != nil || !res[0].Claimed {
		t.Fatalf("claim: %v", err)
	}
	waitFor(t, "the stale row in status", func() bool {
		out, err := run("status", "--json")
		if err != nil || json.Unmarshal([]byte(out), &s) != nil {
			t.Fatalf("status: %q %v", out, err)
		}
		return s.Ledger["stale"] == 1
	})
	if s.Oldest == nil || s.Oldest.Key != "k-dead-holder" || s.Ledger["in_flight"] != 1 {
		t.Fatalf("status %+v", s)
	}
	if out, err := run("status"); err != nil || !strings.Contains(out, "oldest in flight:") || !strings.Contains(out, "owner host-7") ||
		!strings.Contains(out, "stale: its holder died") {
		t.Fatalf("status table: %q %v", out, err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, what, cond)
}
