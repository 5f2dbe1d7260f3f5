package bench

import (
	"context"
	"log/slog"
	"math"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// measureSetup is a bench with what measure reads besides the runs: the
// ledger's Postgres (its commit and WAL counters) and a sandbox.
func measureSetup(t *testing.T, cfg Config) *bench {
	t.Helper()
	ctx := context.Background()
	pg, err := pgx.Connect(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	sb, err := sandbox.New(sandbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	return &bench{cfg: cfg, pg: pg, sandbox: sb}
}

// keepACoreBusy runs another process keeping one core busy until the
// test ends: the machine never goes idle.
func keepACoreBusy(t *testing.T) {
	t.Helper()
	burner := exec.Command("sh", "-c", "while :; do :; done")
	if err := burner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { burner.Process.Kill(); burner.Wait() })
}

// TestEachRunIsDividedByTheNaiveRunJustBeforeIt: with --compare, every
// rep, each fresh and duplicate run of either build is made right after a
// naive run and divided by it, as the report says ("× naive: of each run's
// ratio to the naive run just before it"); and the builds take turns at
// running first, so that neither always follows the other.
func TestEachRunIsDividedByTheNaiveRunJustBeforeIt(t *testing.T) {
	b := measureSetup(t, Config{Jobs: 1000, Reps: 4, Concurrency: 8})
	type ran struct {
		name string
		perS float64
	}
	var runs []ran
	k := 0
	run := func(name string) func(context.Context, int) (time.Duration, int, error) {
		return func(context.Context, int) (time.Duration, int, error) {
			k++
			elapsed := time.Duration(k) * 10 * time.Millisecond // each run its own speed
			runs = append(runs, ran{name, float64(b.cfg.Jobs) / elapsed.Seconds()})
			return elapsed, 0, nil
		}
	}
	r := &Report{Compare: &Comparison{}}
	scenarios := b.scenarios(r, build{}, build{})
	for i := range scenarios { // Run's scenarios, in a comparison, each run counted
		scenarios[i].run = run(scenarios[i].name)
	}
	if err := b.measure(context.Background(), scenarios); err != nil {
		t.Fatal(err)
	}
	order := make([]string, len(runs))
	for i, x := range runs {
		order[i] = x.name
	}
	for _, c := range []struct {
		name string
		t    Throughput
	}{{"fresh", r.Fresh}, {"duplicate", r.Duplicate}, {"fresh (compared)", r.Compare.Fresh}, {"duplicate (compared)", r.Compare.Duplicate}} {
		var want []float64
		for i, x := range runs {
			if x.name == c.name && i > 0 && runs[i-1].name == "naive" {
				want = append(want, x.perS/runs[i-1].perS)
			}
		}
		if len(c.t.NaiveRatios) != len(c.t.Runs) || len(want) != len(c.t.Runs) || len(want) != b.cfg.Reps {
			t.Fatalf("%s: %d runs, %d ratios reported, %d of them right after a naive run; the runs in order: %q; ratios %v",
				c.name, len(c.t.Runs), len(c.t.NaiveRatios), len(want), order, c.t.NaiveRatios)
		}
		for i := range want {
			if c.t.NaiveRatios[i] != want[i] {
				t.Errorf("%s run %d: × naive %.3f, want %.3f (÷ the naive run just before it)", c.name, i+1, c.t.NaiveRatios[i], want[i])
			}
		}
	}
	firstFresh := map[string]int{}
	perRep := len(runs) / b.cfg.Reps
	for rep := range b.cfg.Reps {
		for _, name := range order[rep*perRep : (rep+1)*perRep] {
			if name == "fresh" || name == "fresh (compared)" {
				firstFresh[name]++
				break
			}
		}
	}
	if firstFresh["fresh"] != b.cfg.Reps/2 || firstFresh["fresh (compared)"] != b.cfg.Reps/2 {
		t.Errorf("over %d reps, the build whose fresh run came first: %v; want each half the time (runs in order: %q)", b.cfg.Reps, firstFresh, order)
	}
}

// TestTheSettleWaitIsNotChargedToTheRun: the machine CPU per 1000 jobs a
// run reports is what the machine spent on the run, not what other
// processes spent while measure waited (settle) for the machine to go
// idle: a run that waited its whole Settle on a busy machine reports the
// same machine CPU as one that did not wait.
func TestTheSettleWaitIsNotChargedToTheRun(t *testing.T) {
	keepACoreBusy(t)
	machine := func(settle time.Duration) (float64, time.Duration) {
		b := measureSetup(t, Config{Jobs: 1000, Reps: 1, Concurrency: 8, Settle: settle})
		var r Throughput
		run := func(ctx context.Context, _ int) (time.Duration, int, error) {
			return 100 * time.Millisecond, 0, nil // measure has waited to settle before
		}
		began := time.Now()
		if err := b.measure(context.Background(), []scenario{{name: "fresh", into: &r, run: run}}); err != nil {
			t.Fatal(err)
		}
		return r.MachineCPU, time.Since(began)
	}
	waited, took := machine(2 * time.Second)
	unwaited, _ := machine(-1)
	if took < 2*time.Second {
		t.Errorf("measure took %v on a busy machine with a settle of 2s: it did not wait for the machine to go idle", took)
	}
	if waited-unwaited > 0.5 {
		t.Errorf("machine CPU s/1000 jobs: %.2f after waiting to settle, %.2f without the wait: the wait's %.2f is charged to the run", waited, unwaited, waited-unwaited)
	}
}

// TestALatencyRunMadeInHalvesReportsTheStatementsOfBoth: the ledger's
// statements of a build's two half runs are counted as one run's: calls
// added, the mean weighted by calls, the longest kept.
func TestALatencyRunMadeInHalvesReportsTheStatementsOfBoth(t *testing.T) {
	got := mergeStatements([][]StatementTime{
		{{Kind: "claim", Calls: 300, MeanMs: 0.2, MaxMs: 3}, {Kind: "complete", Calls: 100, MeanMs: 0.1, MaxMs: 1}},
		{{Kind: "claim", Calls: 100, MeanMs: 0.6, MaxMs: 2}, {Kind: "other", Calls: 2, MeanMs: 0.01, MaxMs: 0.01}},
	})
	want := []StatementTime{{Kind: "claim", Calls: 400, MeanMs: 0.3, MaxMs: 3}, {Kind: "complete", Calls: 100, MeanMs: 0.1, MaxMs: 1},
		{Kind: "other", Calls: 2, MeanMs: 0.01, MaxMs: 0.01}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if g, w := got[i], want[i]; g.Kind != w.Kind || g.Calls != w.Calls || math.Abs(g.MeanMs-w.MeanMs) > 1e-9 || g.MaxMs != w.MaxMs {
			t.Errorf("%s: got %+v, want %+v", w.Kind, g, w)
		}
	}
}

// TestAStealNotReadSetsNoStealAgainstANaiveRun: with --compare, each run
// of either build reports its steal less that of the naive run it is
// divided by, one for each of its ratios and no other run any; where
// either run's machine time was not read (readMachineTime's zero, so its
// steal shows as 0) the difference is not known, and is 0, not the other
// run's steal passed off as a difference that moved the ratio.
func TestAStealNotReadSetsNoStealAgainstANaiveRun(t *testing.T) {
	b := measureSetup(t, Config{Jobs: 100, Reps: 3, Concurrency: 8, Settle: -1})
	var names []string
	run := func(name string) func(context.Context, int) (time.Duration, int, error) {
		return func(context.Context, int) (time.Duration, int, error) {
			names = append(names, name)
			return 10 * time.Millisecond, 0, nil
		}
	}
	const perRep = 9 // a comparison's runs a rep
	stealOf := func(k int) float64 { return float64(k*5%7 + 1) }
	// Rep 1's naive runs and rep 2's other runs fail to read their
	// machine time at their end; every other run k loses stealOf(k) %.
	unread := func(k int) bool {
		naive := names[k] == "naive"
		return k/perRep == 0 && naive || k/perRep == 1 && !naive
	}
	calls, acc := 0, 0.0
	b.sample = func(int, int) cpuSample {
		k := calls / 2
		calls++
		if calls%2 == 1 { // the run's start
			return cpuSample{machineTime: machineTime{all: float64(1000 * (k + 1)), steal: acc}}
		}
		if unread(k) {
			return cpuSample{}
		}
		acc += stealOf(k)
		return cpuSample{machineTime: machineTime{all: float64(1000*(k+1) + 100), steal: acc}}
	}
	r := &Report{Compare: &Comparison{}}
	scenarios := b.scenarios(r, build{}, build{})
	for i := range scenarios {
		scenarios[i].run = run(scenarios[i].name)
	}
	if err := b.measure(context.Background(), scenarios); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		t    Throughput
	}{{"fresh", r.Fresh}, {"duplicate", r.Duplicate}, {"fresh (compared)", r.Compare.Fresh}, {"duplicate (compared)", r.Compare.Duplicate}} {
		var want []float64
		for k, name := range names {
			if name != c.name || k == 0 || names[k-1] != "naive" {
				continue
			}
			if unread(k) || unread(k-1) {
				want = append(want, 0)
			} else {
				want = append(want, stealOf(k)-stealOf(k-1))
			}
		}
		if len(want) != b.cfg.Reps || len(c.t.NaiveRatios) != len(want) || !slices.Equal(c.t.StealOverNaive, want) {
			t.Errorf("%s: steal over its naive runs %v, want %v, one for each of its ratios %v (runs in order: %q)",
				c.name, c.t.StealOverNaive, want, c.t.NaiveRatios, names)
		}
	}
	if len(r.Naive.StealOverNaive)+len(r.Slow.StealOverNaive) > 0 {
		t.Errorf("steal over a naive run reported for runs not divided by one: naive %v, slow %v", r.Naive.StealOverNaive, r.Slow.StealOverNaive)
	}
}
