package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/toolq/toolq/internal/testenv"
)

type simSideJSON struct {
	Turns           int `json:"turns"`
	StreamFailures  int `json:"stream_failures"`
	AfterDispatch   int `json:"failures_after_dispatch"`
	NotRun          int `json:"abandoned_not_run"`
	JobsPublished   int `json:"jobs_published"`
	Resends         int `json:"resends"`
	Committed       int `json:"turns_committed"`
	GaveUp          int `json:"turns_given_up"`
	Intended        int `json:"payments_intended"`
	Payments        int `json:"payments_made"`
	DuplicatedTurns int `json:"turns_paid_twice_or_more"`
	Duplicates      int `json:"duplicates"`
}

type simJSON struct {
	Turns              int         `json:"turns"`
	ExpectedDuplicates float64     `json:"expected_duplicates"`
	Naive              simSideJSON `json:"naive"`
	Toolq              simSideJSON `json:"toolq"`
	Record             struct {
		TurnsCommitted int  `json:"turns_committed"`
		NotRun         int  `json:"calls_not_run"`
		OK             bool `json:"ok"`
	} `json:"conversation_record"`
}

func simulateJSON(t *testing.T, args ...string) simJSON {
	t.Helper()
	out, err := runPublisher(t, "", append([]string{"simulate", "--json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r simJSON
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	return r
}

// TestSimulate: with the same failures, the naive dispatcher pays some
// turns twice and toolq pays every turn at most once; calls cut before
// dispatch are never published, and the conversation record holds.
func TestSimulate(t *testing.T) {
	t.Parallel()
	r := simulateJSON(t, "--turns", "400", "--failure-rate", "0.3", "--after-dispatch", "0.5", "--resend-rate", "0.5", "--seed", "7")
	naive, toolq := r.Naive, r.Toolq
	if naive.AfterDispatch == 0 || naive.NotRun == 0 || naive.Resends == 0 || naive.Duplicates == 0 || naive.Payments != naive.JobsPublished {
		t.Fatalf("the scenario produced nothing to prevent: %+v", naive)
	}
	// The same failures on both sides.
	if toolq.StreamFailures != naive.StreamFailures || toolq.AfterDispatch != naive.AfterDispatch || toolq.NotRun != naive.NotRun || toolq.JobsPublished != naive.JobsPublished {
		t.Fatalf("toolq %+v, naive %+v", toolq, naive)
	}
	if toolq.Duplicates != 0 || toolq.DuplicatedTurns != 0 || toolq.Payments < toolq.Committed || toolq.Payments > toolq.Turns {
		t.Fatalf("toolq: %+v", toolq)
	}
	if !r.Record.OK || r.Record.TurnsCommitted != toolq.Committed || r.Record.NotRun != toolq.NotRun {
		t.Fatalf("record %+v, toolq %+v", r.Record, toolq)
	}
	if r.ExpectedDuplicates != 400*0.3*0.5 {
		t.Fatalf("expected duplicates %v", r.ExpectedDuplicates)
	}
	if again := simulateJSON(t, "--turns", "400", "--failure-rate", "0.3", "--after-dispatch", "0.5", "--resend-rate", "0.5", "--seed", "7"); again.Naive != naive {
		t.Fatalf("the same seed played other failures: %+v, then %+v", naive, again.Naive)
	}
	if _, err := runPublisher(t, "", "simulate", "--failure-rate", "2"); err == nil {
		t.Fatal("a rate of 2 was accepted")
	}
}

// TestSimulateArithmetic: the chapter's figures.
func TestSimulateArithmetic(t *testing.T) {
	t.Parallel()
	out, err := runPublisher(t, "", "simulate", "--tool-latency", "820ms", "--provider-gap", "240ms", "--turns-per-month", "5000")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"exposure window per turn: 1.06s = tool latency 820ms + provider gap 240ms", "the window is their sum", "= 3.3\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("%q lacks %q", out, want)
		}
	}
}

// TestSimulateOnARunningServer: with --nats-url the scenario runs over that
// server, twice in a row without the runs meeting; with --database-url as
// well, toolq's side keeps its ledger in that Postgres.
func TestSimulateOnARunningServer(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	db := testenv.Postgres(t)
	for _, extra := range [][]string{nil, {"--database-url", db}} {
		args := append([]string{"--nats-url", n.URL, "--turns", "150", "--failure-rate", "0.3", "--after-dispatch", "0.5", "--seed", "3"}, extra...)
		r := simulateJSON(t, args...)
		if r.Naive.Duplicates == 0 || r.Toolq.Duplicates != 0 || r.Toolq.Payments < r.Toolq.Committed || r.Toolq.Payments > r.Toolq.Turns || !r.Record.OK {
			t.Fatalf("%v: %+v", extra, r)
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var rows int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM toolq_ledger WHERE state = 'completed'`).Scan(&rows); err != nil || rows == 0 {
		t.Fatalf("the Postgres ledger holds %d completed rows (%v): the run did not use it", rows, err)
	}
}
