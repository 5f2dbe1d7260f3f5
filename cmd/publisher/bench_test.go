package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolq/toolq/bench"
	"github.com/toolq/toolq/internal/testenv"
)

// TestBenchMeasuresWhatItSays runs a tiny `publisher bench --json` against
// a test server and a test Postgres. It asserts what the figures mean, not
// how large they are (this machine is shared): every scenario completes,
// the naive and fresh runs pay once per job, the duplicate run (a retried
// turn) pays nothing, and the latency runs measured something.
func TestBenchMeasuresWhatItSays(t *testing.T) {
	t.Parallel()
	nats := testenv.StartNATS(t)
	out, err := runPublisher(t, "", "bench", "--json", "--nats-url", nats.URL, "--database-url", testenv.Postgres(t),
		"--jobs", "300", "--reps", "1", "--concurrency", "8", "--latency-for", "500ms", "--rate", "200")
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var got struct {
		NaiveJobs     float64 `json:"naive_jobs_per_s"`
		FreshJobs     float64 `json:"fresh_jobs_per_s"`
		DuplicateJobs float64 `json:"duplicate_jobs_per_s"`
		SlowJobs      float64 `json:"slow_jobs_per_s"`
		FreshP99      float64 `json:"fresh_p99_ms"`
		NaiveP99      float64 `json:"naive_p99_ms"`
		Rate          int     `json:"rate"`
		Report        bench.Report
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("last line is not the JSON object: %v\n%s", err, out)
	}
	r := got.Report
	if got.NaiveJobs <= 0 || got.FreshJobs <= 0 || got.DuplicateJobs <= 0 || got.SlowJobs <= 0 || got.Rate != 200 {
		t.Fatalf("a scenario did not run: %s", lines[len(lines)-1])
	}
	for name, want := range map[string][2]int{"naive": {r.Naive.Payments, 300}, "fresh": {r.Fresh.Payments, 300},
		"duplicate": {r.Duplicate.Payments, 0}, "slow": {r.Slow.Payments, 0}} {
		if want[0] != want[1] {
			t.Errorf("%s: %d payments, want %d", name, want[0], want[1])
		}
	}
	if r.Fresh.CommitsPerJob <= 0 {
		t.Errorf("fresh: %v ledger commits per job, want some", r.Fresh.CommitsPerJob)
	}
	for _, l := range []bench.Latency{r.NaiveLat, r.ToolqLat, r.NaiveLat100, r.ToolqLat100} {
		if l.Jobs == 0 || l.P50ms <= 0 || l.P50ms > l.P99ms || l.P99ms > l.MaxMs {
			t.Errorf("latency at %d/s: %+v", l.Rate, l)
		}
	}
	if !strings.Contains(out, "slow tool:") || !strings.Contains(out, "duplicate") {
		t.Errorf("no table for people:\n%s", out)
	}
}
