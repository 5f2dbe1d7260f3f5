package bench

import (
	"bufio"
	"context"
	"expvar"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
)

// TestIdleProfiledProcess is not a test: run by
// TestAProcessThatTookNoJobsAllocatedNothing as a process of its own, it
// serves Go's profiles and memory statistics, as a consumer's
// --debug-pprof does, after
// allocating from BENCH_IDLE_SITES distinct call stacks (a process that
// took jobs has that many records in its allocation profile), and idles.
func TestIdleProfiledProcess(t *testing.T) {
	addr := os.Getenv("BENCH_IDLE_ADDR")
	if addr == "" {
		t.Skip("run as a process of its own")
	}
	sites, _ := strconv.Atoi(os.Getenv("BENCH_IDLE_SITES"))
	runtime.MemProfileRate = 1
	for i := range sites {
		allocAt(i, 24)
	}
	runtime.MemProfileRate = 512 * 1024
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.Handle("/debug/vars", expvar.Handler())
	fmt.Println("ready")
	http.Serve(ln, mux)
}

var sink []byte

// allocAt allocates at the bottom of a call stack of depth frames that
// differs for each i.
func allocAt(i, depth int) {
	if depth == 0 {
		sink = make([]byte, 64+i)
		return
	}
	if i>>(depth%10)&1 == 1 {
		allocLeft(i, depth-1)
	} else {
		allocRight(i, depth-1)
	}
}

//go:noinline
func allocLeft(i, depth int) { allocAt(i, depth) }

//go:noinline
func allocRight(i, depth int) { allocAt(i, depth) }

// TestAProcessThatTookNoJobsAllocatedNothing: the allocations counted
// for a run are those of its jobs, its processes' start-up aside. A
// process that took no job, counted against the start-up of another
// process of the same binary, allocated nothing, whatever its allocation
// profile holds.
func TestAProcessThatTookNoJobsAllocatedNothing(t *testing.T) {
	b := measureSetup(t, Config{})
	for _, sites := range []int{0, 500} {
		t.Run(fmt.Sprintf("%d_profile_records", sites), func(t *testing.T) {
			first := startIdle(t, sites)
			objects, bytes, ok := b.mallocs(context.Background(), first)
			if !ok {
				t.Fatal("the first process did not answer")
			}
			b.startups = map[string]allocation{"idle": {objects, bytes}}
			second := startIdle(t, sites)
			b.childMallocs, b.childAllocBytes = -1, -1
			b.countAllocs(context.Background(), second, "idle")()
			// Two starts of one binary differ by a few dozen objects (over a
			// hundred under -race): at most one a job in the smallest run
			// the tests make (300 jobs). A reading's own cost was 1,113
			// objects, 106,392 with 500 profile records.
			if b.childMallocs < 0 || b.childMallocs > 300 {
				t.Errorf("%.0f objects (%.0f bytes) counted for a process that took no job: %.1f a job in a run of 20000 jobs, %.0f in one of 300",
					b.childMallocs, b.childAllocBytes, b.childMallocs/20000, b.childMallocs/300)
			}
		})
	}
}

// startIdle starts TestIdleProfiledProcess as a process of its own, with
// sites allocation sites, and returns it once it serves.
func startIdle(t *testing.T, sites int) []*consumerProc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleProfiledProcess$")
	cmd.Env = append(os.Environ(), "BENCH_IDLE_ADDR="+addr, fmt.Sprintf("BENCH_IDLE_SITES=%d", sites))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "ready") {
	}
	return []*consumerProc{{health: addr}}
}

// TestARunWhoseProcessDidNotAnswerIsLeftOutOfTheAllocations: a run whose
// process did not answer for its allocations (countAllocs leaves 0: not
// known) is left out of their median, not counted as one that allocated
// nothing: of five runs, 100, 110 and 120 allocations a job and two not
// known, the median is 110.
func TestARunWhoseProcessDidNotAnswerIsLeftOutOfTheAllocations(t *testing.T) {
	b := measureSetup(t, Config{Jobs: 100, Reps: 5, Concurrency: 8, Settle: -1})
	perJob := []float64{100, 0, 0, 110, 120} // 0: the process did not answer
	var r Throughput
	run := func(_ context.Context, rep int) (time.Duration, int, error) {
		b.childMallocs, b.childAllocBytes, b.childJobs = perJob[rep]*100, perJob[rep]*100*64, 100
		return 10 * time.Millisecond, 0, nil
	}
	if err := b.measure(context.Background(), []scenario{{name: "fresh", into: &r, run: run}}); err != nil {
		t.Fatal(err)
	}
	if r.AllocsPerJob != 110 {
		t.Errorf("allocations a job: %.0f, want 110, the median of the runs that have the figure", r.AllocsPerJob)
	}
}

// TestConsumerWithoutMemStats is not a test: run by
// TestABuildThatServesNoMemStatsIsStillMeasured as a consumer binary (its
// wrapper passes the consumer's flags in BENCH_CONSUMER_ARGS), it is a
// build of before /debug/vars: ready on --health-addr, Go's profiles
// under /debug/pprof/ (--debug-pprof), no memory statistics.
func TestConsumerWithoutMemStats(t *testing.T) {
	args := strings.Fields(os.Getenv("BENCH_CONSUMER_ARGS"))
	if len(args) == 0 {
		t.Skip("run as a process of its own")
	}
	addr := args[slices.Index(args, "--health-addr")+1]
	if i := slices.Index(args, "--debug-cpuprofile"); i >= 0 { // the file the consumer writes
		if err := os.WriteFile(args[i+1], nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	go http.Serve(ln, mux)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
}

// consumerBeforeMemStats writes into dir a consumer binary that serves
// /readyz and Go's profiles but no /debug/vars (TestConsumerWithoutMemStats)
// and returns its path.
func consumerBeforeMemStats(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "consumer-before-memstats")
	script := fmt.Sprintf("#!/bin/sh\nBENCH_CONSUMER_ARGS=\"$*\" exec %q -test.run='^TestConsumerWithoutMemStats$'\n", os.Args[0])
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestABuildThatServesNoMemStatsIsStillMeasured: --compare against a
// consumer built before /debug/vars was served (any build before the
// allocations were counted) measures it, its allocations not known, as a
// run whose process does not answer is left out of their median: the
// start-up measured before the runs must not stop the whole bench.
func TestABuildThatServesNoMemStatsIsStillMeasured(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := consumerBeforeMemStats(t, dir)
	b := &bench{cfg: Config{NATSURL: "nats://127.0.0.1:4222", DatabaseURL: "postgres://unused", Concurrency: 8, Logger: slog.New(slog.DiscardHandler)},
		toolsFile: filepath.Join(dir, "tools.yaml")}
	if err := b.measureStartups(context.Background(), false, false, bin); err != nil {
		t.Fatalf("a consumer build that serves no /debug/vars stops the bench before any run: %v", err)
	}
	procs, err := b.startProcs(context.Background(), bin, "bench-toolq-pay_b", "pay_b", 1)
	defer stopProcs(procs)
	if err != nil {
		t.Fatal(err)
	}
	b.childMallocs = -1
	b.countAllocs(context.Background(), procs, bin)()
	if b.childMallocs != -1 && b.childMallocs != 0 {
		t.Errorf("its run's allocations: %.0f, want none known", b.childMallocs)
	}
}

// TestNaiveProcess is not a test: run by TestEveryProcessRunHasItsAllocations
// as Config.NaiveCmd (its wrapper passes RunNaive's flags in
// BENCH_NAIVE_ARGS), it is the naive dispatcher as a process of its own,
// as publisher's hidden command runs it.
func TestNaiveProcess(t *testing.T) {
	args := strings.Fields(os.Getenv("BENCH_NAIVE_ARGS"))
	if len(args) == 0 {
		t.Skip("run as a process of its own")
	}
	var cfg NaiveConfig
	fs := flag.NewFlagSet("naive", flag.ContinueOnError)
	cfg.Flags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := RunNaive(ctx, cfg, os.Stdout); err != nil {
		t.Fatal(err)
	}
}

// TestEveryProcessRunHasItsAllocations: a run made by processes of their
// own has its allocations a job, whatever runs in this process besides:
// the scaling runs with --in-process (the consumer binary beside the
// publisher still runs them), and the naive dispatcher's runs when there
// is no consumer binary (it is a process of its own all the same). Both
// had them when a run's allocations were read at its start and end.
func TestEveryProcessRunHasItsAllocations(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "github.com/toolq/toolq/cmd/consumer").CombinedOutput(); err != nil {
		t.Fatalf("build the consumer: %v\n%s", err, out)
	}
	naive := filepath.Join(dir, "naive")
	script := fmt.Sprintf("#!/bin/sh\nBENCH_NAIVE_ARGS=\"$*\" exec %q -test.run='^TestNaiveProcess$'\n", os.Args[0])
	if err := os.WriteFile(naive, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		got  func(*Report) float64
	}{
		{"in_process_scaling", Config{InProcess: true, ConsumerBin: filepath.Join(dir, "consumer"), Processes: []int{1}},
			func(r *Report) float64 { return r.Processes[0].AllocsPerJob }},
		{"naive_without_consumer_binary", Config{NaiveCmd: []string{naive}, Processes: []int{}},
			func(r *Report) float64 { return r.Naive.AllocsPerJob }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			// A server of its own: the same calls published again within
			// the stream's duplicate window would never be delivered.
			cfg.NATSURL, cfg.DatabaseURL = testenv.StartNATS(t).URL, testenv.Postgres(t)
			cfg.Jobs, cfg.Reps, cfg.Concurrency, cfg.LatencyFor, cfg.Rate, cfg.Settle = 100, 1, 4, 200*time.Millisecond, 50, -1
			r, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.got(r); got <= 0 {
				t.Errorf("allocations a job: %.0f, want the figure (its processes served /debug/vars)", got)
			}
		})
	}
}

// TestTheStartUpsProfilesAreNamed: with --profile, the processes whose
// start-up is measured write their CPU profiles into the profile
// directory under a name of their own (SCENARIO-REP[-N].prof), not beside
// it as DIR.prof (the run's name was still empty), each build's over the
// last's.
func TestTheStartUpsProfilesAreNamed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := consumerBeforeMemStats(t, dir)
	profiles := filepath.Join(dir, "prof")
	if err := os.Mkdir(profiles, 0o755); err != nil {
		t.Fatal(err)
	}
	b := &bench{cfg: Config{NATSURL: "nats://127.0.0.1:4222", DatabaseURL: "postgres://unused", Concurrency: 8, ProfileDir: profiles,
		Logger: slog.New(slog.DiscardHandler)}, toolsFile: filepath.Join(dir, "tools.yaml")}
	b.measureStartups(context.Background(), false, false, bin)
	files, _ := filepath.Glob(filepath.Join(profiles, "*"))
	outside, _ := filepath.Glob(filepath.Join(dir, "*.prof"))
	if len(files) == 0 || len(outside) > 0 {
		t.Errorf("the start-up's CPU profile: %v in the profile directory, %v beside it", files, outside)
	}
}
