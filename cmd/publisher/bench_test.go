package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/toolq/toolq/bench"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
)

// TestMain runs this test binary as the bench's naive dispatcher process
// when the bench re-executes itself for one, as the publisher binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == naiveCommand {
		cli.Main("publisher", run)
		return
	}
	os.Exit(m.Run())
}

// TestBenchMeasuresWhatItSays runs a tiny `publisher bench --json` against
// a test server and a test Postgres. It asserts what the figures mean, not
// how large they are (this machine is shared): every scenario completes,
// the naive and fresh runs pay once per job, the duplicate run (a retried
// turn) pays nothing, and the latency runs measured something.
func TestBenchMeasuresWhatItSays(t *testing.T) {
	t.Parallel()
	nats := testenv.StartNATS(t)
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "github.com/toolq/toolq/cmd/consumer").CombinedOutput(); err != nil {
		t.Fatalf("build the consumer: %v\n%s", err, out)
	}
	out, err := runPublisher(t, "", "bench", "--json", "--nats-url", nats.URL, "--database-url", testenv.Postgres(t),
		"--jobs", "300", "--reps", "1", "--concurrency", "8", "--latency-for", "500ms", "--rate", "200", "--settle", "300ms", "--warm-up", "100ms",
		"--consumer", filepath.Join(dir, "consumer"), "--processes", "1,2", "--memory-for", "3s",
		"--compare", filepath.Join(dir, "consumer"), "--profile", filepath.Join(dir, "prof", "run"))
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
		"duplicate": {r.Duplicate.Payments, 0}, "slow": {r.Slow.Payments, 300}} {
		if want[0] != want[1] {
			t.Errorf("%s: %d payments, want %d", name, want[0], want[1])
		}
	}
	// The naive dispatcher ran before fresh and before duplicate, for each
	// build, and each of toolq's runs is divided by the naive run just
	// before it.
	if len(r.Naive.Runs) != 4 || len(r.Fresh.NaiveRatios) != 1 || len(r.Duplicate.NaiveRatios) != 1 ||
		r.Fresh.NaiveRatios[0] != r.Fresh.Runs[0]/r.Naive.Runs[0] || r.Duplicate.NaiveRatios[0] != r.Duplicate.Runs[0]/r.Naive.Runs[1] {
		t.Errorf("naive runs %v; fresh %v × naive %v; duplicate %v × naive %v", r.Naive.Runs, r.Fresh.Runs, r.Fresh.NaiveRatios, r.Duplicate.Runs, r.Duplicate.NaiveRatios)
	}
	if r.Fresh.CommitsPerJob <= 0 {
		t.Errorf("fresh: %v ledger commits per job, want some", r.Fresh.CommitsPerJob)
	}
	// The consumer and the naive dispatcher ran as processes of their own:
	// their CPU is theirs, the driver's and Postgres's are apart.
	if r.InProcess {
		t.Errorf("the consumer ran inside the bench's process")
	}
	for name, th := range map[string]bench.Throughput{"naive": r.Naive, "fresh": r.Fresh, "duplicate": r.Duplicate} {
		if th.CPUPer1000 <= 0 || th.DriverCPU <= 0 || th.PeakRSSMiB <= 0 || th.StealPct < 0 || th.StealPct >= 100 || len(th.RunsSteal) != len(th.Runs) {
			t.Errorf("%s: no figures of its own process: %+v", name, th)
		}
	}
	// What each process allocated per job while it took the jobs: some
	// objects for every job (a tool call, a result, an ack each), and a
	// fresh call more than a duplicate (the tool call, its ledger writes).
	for name, th := range map[string]bench.Throughput{"naive": r.Naive, "fresh": r.Fresh, "duplicate": r.Duplicate, "compared fresh": r.Compare.Fresh} {
		if th.AllocsPerJob < 10 || th.AllocBytesPerJob < 1000 || th.AllocsPerJob > 100000 {
			t.Errorf("%s: %.0f allocations, %.0f bytes per job", name, th.AllocsPerJob, th.AllocBytesPerJob)
		}
	}
	// The scaling runs take the same calls on 1 and 2 processes: about as
	// many allocations a job on both, counted over every job each took
	// (the jobs the first process took while the second started too).
	if len(r.Processes) == 2 {
		if one, two := r.Processes[0].AllocsPerJob, r.Processes[1].AllocsPerJob; two < 0.8*one || two > 1.25*one {
			t.Errorf("allocations a job: %.0f on 1 process, %.0f on 2: the jobs taken before the count began are divided in", one, two)
		}
	}
	if r.Fresh.AllocsPerJob <= r.Duplicate.AllocsPerJob {
		t.Errorf("a fresh call allocated %.0f objects, a duplicate %.0f: the fresh call's tool call and ledger writes are missing", r.Fresh.AllocsPerJob, r.Duplicate.AllocsPerJob)
	}
	// The second build compared ran the same calls of its own: paid once
	// each when fresh, never when duplicated, and was timed at both rates.
	if c := r.Compare; c == nil || c.Fresh.Payments != 300 || c.Duplicate.Payments != 0 || c.Fresh.JobsPerS <= 0 || c.Duplicate.JobsPerS <= 0 ||
		c.Lat.P99ms <= 0 || c.Lat100.P99ms <= 0 || c.Lat.Rate != 200 {
		t.Errorf("comparison: %+v", r.Compare)
	}
	for name, l := range map[string]bench.Latency{"naive": r.NaiveLat, "toolq": r.ToolqLat, "compared": r.Compare.Lat,
		"naive at 100/s": r.NaiveLat100, "toolq at 100/s": r.ToolqLat100, "compared at 100/s": r.Compare.Lat100} {
		if l.StealPct < 0 || l.StealPct >= 100 {
			t.Errorf("%s latency run: steal %.1f %%", name, l.StealPct)
		}
	}
	// Each build's latency run at a rate, made in two halves, counts every
	// job of both: as many jobs as the naive dispatcher's one run.
	if c := r.Compare; c != nil && (c.Lat.Jobs != 100 || r.ToolqLat.Jobs != 100 || r.NaiveLat.Jobs != 100 || c.Lat100.Jobs != 50 || r.ToolqLat100.Jobs != 50) {
		t.Errorf("latency jobs: naive %d, consumer %d and %d, compared %d and %d; want 100 at 200/s, 50 at 100/s",
			r.NaiveLat.Jobs, r.ToolqLat.Jobs, r.ToolqLat100.Jobs, c.Lat.Jobs, c.Lat100.Jobs)
	}
	if !strings.Contains(out, "compared ÷ consumer") {
		t.Errorf("no table for the comparison:\n%s", out)
	}
	// The comparison's throughput is the two builds' × naive, each run
	// divided by the naive run just before it, divided rep by rep.
	if c := r.Compare; c != nil && len(c.Fresh.NaiveRatios) == 1 && len(r.Fresh.NaiveRatios) == 1 {
		want := fmt.Sprintf("%.2f", c.Fresh.NaiveRatios[0]/r.Fresh.NaiveRatios[0])
		if !regexp.MustCompile(`fresh × naive\s+[0-9.]+\s+[0-9.]+\s+` + regexp.QuoteMeta(want) + `\s+` + regexp.QuoteMeta(want) + `\n`).MatchString(out) {
			t.Errorf("the comparison's fresh × naive row does not give %s (the compared build's × naive ÷ the consumer's):\n%s", want, out)
		}
	} else {
		t.Errorf("the compared build's runs were not each divided by a naive run: %+v", r.Compare)
	}
	if r.Fresh.PostgresCPU <= 0 {
		t.Errorf("fresh: no Postgres CPU: %+v", r.Fresh)
	}
	for _, l := range []bench.Latency{r.NaiveLat, r.ToolqLat, r.NaiveLat100, r.ToolqLat100} {
		if l.Jobs == 0 || l.P50ms <= 0 || l.P50ms > l.P99ms || l.P99ms > l.MaxMs {
			t.Errorf("latency at %d/s: %+v", l.Rate, l)
		}
	}
	// Where the latency goes: every phase of a delivery was measured.
	phases := map[string]bool{}
	for _, p := range r.Phases {
		if p.P50ms <= 0 || p.P50ms > p.P99ms {
			t.Errorf("phase %+v", p)
		}
		phases[p.Name] = true
	}
	for _, name := range []string{"publish to processing", "claim (ledger)", "tool call", "record the outcome (ledger)", "publish the result", "processing (decode to ack)"} {
		if !phases[name] {
			t.Errorf("no phase %q in %+v", name, r.Phases)
		}
	}
	// The consumer binary, as separate processes on one durable: each run
	// pays every job once, and the memory run sampled the process.
	if len(r.Processes) != 2 || r.Processes[0].N != 1 || r.Processes[1].N != 2 {
		t.Fatalf("scaling runs: %+v", r.Processes)
	}
	for _, p := range r.Processes {
		if p.JobsPerS <= 0 || p.Payments != 300 || p.PeakRSSMiB <= 0 || p.CPUPer1000 <= 0 {
			t.Errorf("%d processes: %+v, want 300 payments and figures", p.N, p.Throughput)
		}
	}
	if m := r.Memory; m == nil || m.Jobs != 600 || len(m.Samples) < 2 || m.StartMiB <= 0 || m.EndMiB <= 0 || m.MaxMiB < m.EndMiB {
		t.Errorf("memory run: %+v", r.Memory)
	}
	if !strings.Contains(out, "consumer processes") || !strings.Contains(out, "memory: one consumer process") {
		t.Errorf("no table for the process runs:\n%s", out)
	}
	if !strings.Contains(out, "slow tool:") || !strings.Contains(out, "duplicate") {
		t.Errorf("no table for people:\n%s", out)
	}
	// --profile made its directory, and a CPU profile of each scenario's
	// consumer and a profile and trace of each latency run are in it.
	for _, name := range []string{"fresh-1.prof", "duplicate-1.prof", "fresh-1.allocs", "latency-200.trace", "latency-200-2.trace", "latency-200-compared.trace", "latency-200-compared-2.trace",
		"latency-200.prof", "latency-200.allocs", "latency-100-compared.prof"} {
		if fi, err := os.Stat(filepath.Join(dir, "prof", "run", name)); err != nil || fi.Size() == 0 {
			entries, _ := os.ReadDir(filepath.Join(dir, "prof", "run"))
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Errorf("--profile: %s: %v (the directory holds %v)", name, err, names)
		}
	}
}

// TestTheLatencyTableShowsTheComparedBuild: in a comparison the latency
// table has the compared build's runs too, their steal with them (the
// comparison's table has only their p99s).
func TestTheLatencyTableShowsTheComparedBuild(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	printBench(cli.IO{Out: &out}, &bench.Report{SlowBound: 1,
		NaiveLat: bench.Latency{Rate: 200}, ToolqLat: bench.Latency{Rate: 200}, NaiveLat100: bench.Latency{Rate: 100}, ToolqLat100: bench.Latency{Rate: 100},
		Compare: &bench.Comparison{Lat: bench.Latency{Rate: 200, P99ms: 7, StealPct: 42.4}, Lat100: bench.Latency{Rate: 100, P99ms: 1, StealPct: 43.4}}})
	for _, want := range []string{`(?m)^compared\s+200/s\s+0\.00\s+0\.00\s+7\.00\s+0\.00\s+42\.4$`, `(?m)^compared\s+100/s\s+0\.00\s+0\.00\s+1\.00\s+0\.00\s+43\.4$`} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("no row %s in:\n%s", want, out.String())
		}
	}
}

// TestEachRunsRatioShowsItsStealAgainstItsNaiveRun: the line of each run's
// ratio to its naive run shows, for a run whose steal differs from its
// naive run's by 2 points or more, by how much, and says what that means;
// with no such run it shows the ratios alone.
func TestEachRunsRatioShowsItsStealAgainstItsNaiveRun(t *testing.T) {
	t.Parallel()
	report := func(freshSteal, dupSteal []float64) string {
		var out strings.Builder
		printBench(cli.IO{Out: &out}, &bench.Report{SlowBound: 1,
			Fresh:     bench.Throughput{NaiveRatios: []float64{0.5, 0.6}, StealOverNaive: freshSteal},
			Duplicate: bench.Throughput{NaiveRatios: []float64{1.2, 1.0}, StealOverNaive: dupSteal}})
		return out.String()
	}
	out := report([]float64{0.5, -3.2}, []float64{1.9, 11})
	for _, want := range []string{"each run × the naive run just before it: fresh 0.50 0.60 (steal -3.2), duplicate 1.20 1.00 (steal +11.0)\n", "(steal +N or -N: "} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	out = report([]float64{0.5, -1.9}, []float64{1.9, 0})
	if !strings.Contains(out, "fresh 0.50 0.60, duplicate 1.20 1.00\n") || strings.Contains(out, "steal +N") {
		t.Errorf("runs whose steal is within 2 points of their naive run's, printed:\n%s", out)
	}
}

// TestARatiosStealIsMarkedFromTwoPointsAndSaysWhichWay: a difference of
// exactly 2 points is marked ("2 points or more"), either way, and the
// legend says which way the machine moved the ratio: more steal than the
// naive run's lowered it, less raised it.
func TestARatiosStealIsMarkedFromTwoPointsAndSaysWhichWay(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	printBench(cli.IO{Out: &out}, &bench.Report{SlowBound: 1,
		Fresh:     bench.Throughput{NaiveRatios: []float64{0.5, 0.6}, StealOverNaive: []float64{2, 0}},
		Duplicate: bench.Throughput{NaiveRatios: []float64{1.2, 1.0}, StealOverNaive: []float64{0, -2}}})
	for _, want := range []string{
		"fresh 0.50 (steal +2.0) 0.60, duplicate 1.20 1.00 (steal -2.0)\n",
		"(steal +N or -N: the run lost N points more or fewer of the machine to steal than its naive run did, which lowered or raised its ratio)\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in:\n%s", want, out.String())
		}
	}
}

// TestThePlainLedgerDispatcherPaysOnceAndAnswersARetriedTurnFromItsRow:
// with --plain-ledger the compared place is the plain ledger dispatcher, a
// process of its own (this binary again): its fresh run pays every call
// once and writes two ledger commits a call (the claim and the
// completion), its duplicate run (a retried turn of the same calls) pays
// nothing, and it is timed at both rates. A second bench on the same
// database makes calls of its own: its fresh runs pay every call again,
// though the first bench's ledgers have the first bench's calls completed.
func TestThePlainLedgerDispatcherPaysOnceAndAnswersARetriedTurnFromItsRow(t *testing.T) {
	t.Parallel()
	nats, db := testenv.StartNATS(t), testenv.Postgres(t)
	for i := range 2 {
		out, err := runPublisher(t, "", "bench", "--json", "--nats-url", nats.URL, "--database-url", db, "--plain-ledger",
			"--jobs", "300", "--reps", "1", "--concurrency", "8", "--latency-for", "500ms", "--rate", "200", "--settle", "300ms", "--warm-up", "100ms", "--processes", "")
		if err != nil {
			t.Fatalf("bench %d: %v\n%s", i+1, err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var got struct{ Report bench.Report }
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
			t.Fatalf("bench %d: last line is not the JSON object: %v\n%s", i+1, err, out)
		}
		r := got.Report
		if r.Fresh.Payments != 300 || r.Duplicate.Payments != 0 {
			t.Errorf("bench %d: toolq paid %d calls fresh and %d duplicated, want 300 and 0", i+1, r.Fresh.Payments, r.Duplicate.Payments)
		}
		c := r.Compare
		if c == nil || c.Bin != "plain ledger dispatcher" {
			t.Fatalf("bench %d: the compared place is %+v, want the plain ledger dispatcher", i+1, c)
		}
		if c.Fresh.Payments != 300 || c.Duplicate.Payments != 0 {
			t.Errorf("bench %d: the plain ledger dispatcher paid %d calls fresh and %d duplicated, want 300 and 0", i+1, c.Fresh.Payments, c.Duplicate.Payments)
		}
		// The database's commits count the bench's own statements too.
		if c.Fresh.CommitsPerJob < 1.9 || c.Fresh.CommitsPerJob-c.Duplicate.CommitsPerJob < 0.8 {
			t.Errorf("bench %d: the plain ledger dispatcher's commits a call: %.2f fresh (want 2: a claim, a completion), %.2f duplicated (want one fewer: no completion)",
				i+1, c.Fresh.CommitsPerJob, c.Duplicate.CommitsPerJob)
		}
		if c.Fresh.CPUPer1000 <= 0 || c.Fresh.AllocsPerJob <= 0 || c.Lat.Jobs != 100 || c.Lat.P99ms <= 0 || c.Lat100.P99ms <= 0 {
			t.Errorf("bench %d: the plain ledger dispatcher was not measured as a process of its own: %+v", i+1, c)
		}
		if !strings.Contains(out, "compared: plain ledger dispatcher") {
			t.Errorf("bench %d: the table does not name the plain ledger dispatcher:\n%s", i+1, out)
		}
	}
}

// TestComparePlainLedgerAndABuildIsRefused: the compared place holds one
// thing.
func TestComparePlainLedgerAndABuildIsRefused(t *testing.T) {
	t.Parallel()
	_, err := runPublisher(t, "", "bench", "--plain-ledger", "--compare", "bin/consumer")
	if err == nil || !strings.Contains(err.Error(), "give one") {
		t.Fatalf("--plain-ledger with --compare: %v", err)
	}
}
