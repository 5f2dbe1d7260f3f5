package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toolq/toolq/bench"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
)

const benchSynopsis = `publisher bench [--quick] [--jobs N] [--reps N] [--concurrency N] [--rate R] [--compare CONSUMER | --plain-ledger] [--json]

Measures, in one run on this machine, what toolq's exactly-once effects cost next to a
naive dispatcher with no memory (pull, POST the sandbox, publish the result, ack). Each
runs as a process of its own with the same settings: the consumer binary beside this one
(or --consumer), and the naive dispatcher (this binary again). Scenarios:
  naive      the naive dispatcher
  fresh      toolq, every job new: the sandbox payments API over HTTP, Postgres ledger
  duplicate  toolq, every job's call already completed (a retried turn: new tool_use_id)
  slow       toolq with a tool that takes 50ms (the bound is concurrency / latency)
  latency    publish-to-result percentiles of naive and toolq at one fixed rate, and at 100/s
With no --nats-url it starts a nats-server process of its own; with no --database-url a
throwaway Postgres cluster with fsync and synchronous commit on (initdb and pg_ctl must
be installed). --compare runs the fresh, duplicate and latency scenarios with a second
consumer build too, each run beside the first build's, and prints the ratios: of the two
builds' × naive rep by rep, and of their medians. --plain-ledger runs them with the
plain ledger dispatcher in the compared place instead: the naive dispatcher keeping a row
per call in the same Postgres (claimed before its call without waiting for the disk,
completed after it waiting, a completed call answered from its row), one statement a
call. The JSON line (--json) is printed last.`

func runBench(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("bench", benchSynopsis, stdio)
	natsURL := fs.String("nats-url", "", "a running NATS server (empty: start one as a separate process)")
	dbURL := fs.String("database-url", "", "a Postgres database for the ledger (empty: start a throwaway cluster)")
	var cfg bench.Config
	fs.IntVar(&cfg.Jobs, "jobs", 20000, "jobs per throughput run")
	fs.IntVar(&cfg.Reps, "reps", 3, "runs of each throughput scenario (the median is reported)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "tool calls at once, and 4 × as many jobs in flight, for toolq and the naive dispatcher alike")
	fs.IntVar(&cfg.Rate, "rate", 0, "jobs/s of the latency runs (0: half of toolq's fresh throughput)")
	fs.DurationVar(&cfg.LatencyFor, "latency-for", 10*time.Second, "how long each latency run publishes")
	fs.DurationVar(&cfg.WarmUp, "warm-up", time.Second, "how long each latency run publishes at its rate, uncounted, before the jobs it counts (0: none)")
	fs.DurationVar(&cfg.Settle, "settle", 5*time.Second, "how long each throughput and latency run waits at most for the machine to go idle before it starts (0: no wait)")
	quick := fs.Bool("quick", false, "a short run (about a minute): 2,000 jobs, one run each, 3s latency runs")
	asJSON := fs.Bool("json", false, "print the figures as one JSON object, on the last line")
	consumer := fs.String("consumer", "", "the consumer binary under test, run as processes (empty: ./consumer beside this binary, if there is one)")
	fs.StringVar(&cfg.CompareBin, "compare", "", "a second consumer binary: its fresh, duplicate and latency runs are made beside the first's, and the ratios printed")
	fs.BoolVar(&cfg.ComparePlain, "plain-ledger", false, "run the fresh, duplicate and latency runs with the plain ledger dispatcher beside the consumer's, as --compare does a second build")
	fs.StringVar(&cfg.ProfileDir, "profile", "", "write a CPU and allocation profile of every consumer process into this directory (of a latency run's: of its counted jobs, and an execution trace)")
	fs.BoolVar(&cfg.InProcess, "in-process", false, "run toolq's worker and the naive dispatcher inside this process (with --cpuprofile: a profile of everything)")
	processes := fs.String("processes", "1,2,4", "consumer process counts of the scaling runs, comma-separated (empty: none)")
	fs.DurationVar(&cfg.MemoryFor, "memory-for", 0, "also run one consumer process at the fixed rate this long, sampling its RSS (e.g. 10m)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof; -tagfocus scenario=NAME keeps one scenario)")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	var err error
	// The bench's own process runs the in-process scenarios (--in-process,
	// the latency phases): at the consumer's garbage collection too.
	cli.SetServiceGC(getenv)
	if *quick {
		cfg.Jobs, cfg.Reps, cfg.LatencyFor = 2000, 1, 3*time.Second
	}
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return fmt.Errorf("bench: --profile: %w", err)
		}
	}
	if cfg.Settle <= 0 {
		cfg.Settle = -1 // the flag's 0 is the config's "no wait"
	}
	if cfg.WarmUp <= 0 {
		cfg.WarmUp = -1 // the flag's 0 is the config's "none"
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stdio.Err, nil))
	if cfg.Processes, err = parseCounts(*processes); err != nil {
		return cli.Usagef("--processes: %w", err)
	}
	cfg.ConsumerBin = *consumer
	if cfg.ConsumerBin == "" {
		cfg.ConsumerBin = besideSelf("consumer")
	}
	if cfg.ConsumerBin == "" {
		cfg.Logger.Warn("bench: no consumer binary beside this one: toolq runs inside this process, and the scaling and memory runs are not made " +
			"(go build -o bin/ ./cmd/consumer ./cmd/publisher && bin/publisher bench, or --consumer PATH)")
	}
	if cfg.CompareBin != "" && cfg.ComparePlain {
		return cli.Usagef("--compare and --plain-ledger both name what runs in the compared place: give one")
	}
	if cfg.CompareBin != "" && (cfg.InProcess || cfg.ConsumerBin == "") {
		return cli.Usagef("--compare needs the consumer as a process: a --consumer binary (or one beside this one), without --in-process")
	}
	if self, err := os.Executable(); err == nil {
		cfg.NaiveCmd = []string{self, naiveCommand}
	}
	cfg.NATSURL, cfg.DatabaseURL = *natsURL, *dbURL
	if cfg.NATSURL == "" {
		url, pid, stop, err := startNATSProcess()
		if err != nil {
			return fmt.Errorf("bench: start nats-server: %w", err)
		}
		defer stop()
		cfg.NATSURL, cfg.NATSPID = url, pid
	}
	if cfg.DatabaseURL == "" {
		// pg_stat_statements times the ledger's statements on the server,
		// for the latency runs (a server without it starts without it).
		c, err := testenv.StartDurableCluster("shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track_utility=off")
		if err != nil {
			c, err = testenv.StartDurableCluster()
		}
		if err != nil {
			return fmt.Errorf("bench: start Postgres (or give --database-url): %w", err)
		}
		defer c.Destroy()
		cfg.DatabaseURL = c.URL("postgres")
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	r, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	printBench(stdio, r)
	if *asJSON { // one line, the last
		line, err := json.Marshal(benchJSON(r))
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdio.Out, "%s\n", line)
		return err
	}
	return nil
}

func printBench(stdio cli.IO, r *bench.Report) {
	where := "each a process of its own"
	if r.InProcess {
		where = "toolq and the naive dispatcher inside the bench's process"
	}
	fmt.Fprintf(stdio.Out, "%d jobs a run, %d in flight, %d tool calls at once, median of %d runs (× naive: of each run's ratio to the naive run just before it); %s\n",
		r.Jobs, 4*r.Concurrency, r.Concurrency, len(r.Fresh.Runs), where)
	w := cli.NewTable(stdio.Out)
	fmt.Fprintf(w, "scenario\tjobs/s\t× naive\tCPU s/1000 jobs: consumer\tdriver\tnats\tpostgres\tmachine\tsteal %%\tledger commits/job\tWAL flushes/job\tpeak RSS MiB\tallocs/job\tKiB/job\n")
	for _, row := range []struct {
		name string
		t    bench.Throughput
	}{{"naive", r.Naive}, {"fresh", r.Fresh}, {"duplicate", r.Duplicate}, {"slow (50ms tool)", r.Slow}} {
		x := row.t.XNaive()
		if x == 0 {
			x = row.t.JobsPerS / r.Naive.JobsPerS
		}
		fmt.Fprintf(w, "%s\t%.0f\t%.2f\t%.3f\t%s\t%s\t%s\t%.3f\t%.1f\t%.2f\t%.3f\t%.0f\t%s\t%s\n", row.name, row.t.JobsPerS, x,
			row.t.CPUPer1000, known(row.t.DriverCPU), known(row.t.NATSCPU), known(row.t.PostgresCPU), row.t.MachineCPU, row.t.StealPct,
			row.t.CommitsPerJob, row.t.FlushesPerJob, row.t.PeakRSSMiB, knownInt(row.t.AllocsPerJob), knownInt(row.t.AllocBytesPerJob/1024))
	}
	w.Flush()
	if len(r.Fresh.NaiveRatios) > 1 {
		fmt.Fprintf(stdio.Out, "each run × the naive run just before it: fresh %s, duplicate %s\n",
			naiveRatios(r.Fresh.NaiveRatios, r.Fresh.StealOverNaive), naiveRatios(r.Duplicate.NaiveRatios, r.Duplicate.StealOverNaive))
		if unequalSteal(r.Fresh.StealOverNaive) || unequalSteal(r.Duplicate.StealOverNaive) {
			fmt.Fprintf(stdio.Out, "(steal +N or -N: the run lost N points more or fewer of the machine to steal than its naive run did, which lowered or raised its ratio)\n")
		}
	}
	fmt.Fprintf(stdio.Out, "slow tool: %.0f jobs/s of a bound of %.0f (concurrency %d / 50ms): %.0f%%\n\n",
		r.Slow.JobsPerS, r.SlowBound, r.Concurrency, 100*r.Slow.JobsPerS/r.SlowBound)
	w = cli.NewTable(stdio.Out)
	fmt.Fprintf(w, "latency\trate\tp50 ms\tp90 ms\tp99 ms\tmax ms\tsteal %%\n")
	type latencyRow struct {
		name string
		l    bench.Latency
	}
	rows := []latencyRow{{"naive", r.NaiveLat}, {"toolq", r.ToolqLat}}
	if c := r.Compare; c != nil {
		rows = append(rows, latencyRow{"compared", c.Lat})
	}
	rows = append(rows, latencyRow{"naive", r.NaiveLat100}, latencyRow{"toolq", r.ToolqLat100})
	if c := r.Compare; c != nil {
		rows = append(rows, latencyRow{"compared", c.Lat100})
	}
	for _, row := range rows {
		fmt.Fprintf(w, "%s\t%d/s\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\n", row.name, row.l.Rate, row.l.P50ms, row.l.P90ms, row.l.P99ms, row.l.MaxMs, row.l.StealPct)
	}
	w.Flush()
	if len(r.ToolqLat.Ledger)+len(r.ToolqLat100.Ledger) > 0 {
		fmt.Fprintf(stdio.Out, "\nthe ledger's statements in toolq's latency runs, as Postgres timed them (pg_stat_statements, execution only):\n")
		w = cli.NewTable(stdio.Out)
		fmt.Fprintf(w, "rate\tstatement\tcalls\tmean ms\tmax ms\n")
		for _, l := range []bench.Latency{r.ToolqLat, r.ToolqLat100} {
			for _, st := range l.Ledger {
				fmt.Fprintf(w, "%d/s\t%s\t%d\t%.3f\t%.2f\n", l.Rate, st.Kind, st.Calls, st.MeanMs, st.MaxMs)
			}
		}
		w.Flush()
	}
	if c := r.Compare; c != nil {
		fmt.Fprintf(stdio.Out, "\ncompared: %s (the same runs as the consumer's, each after a naive run, the two builds taking turns at going first; each latency run in two halves, consumer, compared, compared, consumer)\n", c.Bin)
		w = cli.NewTable(stdio.Out)
		fmt.Fprintf(w, "figure\tconsumer\tcompared\tcompared ÷ consumer\tper rep\n")
		// The throughput rows compare the two builds' × naive, rep by rep:
		// each run divided by the naive run just before it cancels the
		// machine's drift, which moved one build's fresh runs by a fifth
		// within a minute.
		for _, row := range []struct {
			name string
			a, b bench.Throughput
		}{{"fresh × naive", r.Fresh, c.Fresh}, {"duplicate × naive", r.Duplicate, c.Duplicate}} {
			ratio, reps := repRatios(row.b.NaiveRatios, row.a.NaiveRatios)
			fmt.Fprintf(w, "%s\t%.3f\t%.3f\t%.2f\t%s\n", row.name, row.a.XNaive(), row.b.XNaive(), ratio, reps)
		}
		for _, row := range []struct {
			name string
			a, b float64
		}{{"fresh allocs/job: consumer", r.Fresh.AllocsPerJob, c.Fresh.AllocsPerJob},
			{"fresh KiB/job: consumer", r.Fresh.AllocBytesPerJob / 1024, c.Fresh.AllocBytesPerJob / 1024},
			{"duplicate allocs/job: consumer", r.Duplicate.AllocsPerJob, c.Duplicate.AllocsPerJob},
			{"duplicate KiB/job: consumer", r.Duplicate.AllocBytesPerJob / 1024, c.Duplicate.AllocBytesPerJob / 1024},
			{"fresh jobs/s", r.Fresh.JobsPerS, c.Fresh.JobsPerS},
			{"duplicate jobs/s", r.Duplicate.JobsPerS, c.Duplicate.JobsPerS},
			{"fresh CPU s/1000: consumer", r.Fresh.CPUPer1000, c.Fresh.CPUPer1000},
			{"fresh CPU s/1000: postgres", r.Fresh.PostgresCPU, c.Fresh.PostgresCPU},
			{"fresh CPU s/1000: machine", r.Fresh.MachineCPU, c.Fresh.MachineCPU},
			{"duplicate CPU s/1000: consumer", r.Duplicate.CPUPer1000, c.Duplicate.CPUPer1000},
			{"duplicate CPU s/1000: postgres", r.Duplicate.PostgresCPU, c.Duplicate.PostgresCPU},
			{"duplicate CPU s/1000: machine", r.Duplicate.MachineCPU, c.Duplicate.MachineCPU},
			{fmt.Sprintf("p99 ms at %d/s", r.ToolqLat.Rate), r.ToolqLat.P99ms, c.Lat.P99ms},
			{"p99 ms at 100/s", r.ToolqLat100.P99ms, c.Lat100.P99ms}} {
			fmt.Fprintf(w, "%s\t%.3f\t%.3f\t%.2f\t\n", row.name, row.a, row.b, row.b/row.a)
		}
		w.Flush()
	}
	for _, ph := range []struct {
		rate   int
		phases []bench.Phase
	}{{r.ToolqLat.Rate, r.Phases}, {100, r.Phases100}} {
		if len(ph.phases) == 0 {
			continue
		}
		fmt.Fprintf(stdio.Out, "\nwhere toolq's latency goes at %d/s (from its spans, in a run of its own, in this process):\n", ph.rate)
		w = cli.NewTable(stdio.Out)
		fmt.Fprintf(w, "phase\tp50 ms\tp99 ms\tmean of the slowest 1%% ms\n")
		for _, p := range ph.phases {
			fmt.Fprintf(w, "%s\t%.2f\t%.2f\t%.2f\n", p.Name, p.P50ms, p.P99ms, p.SlowMs)
		}
		w.Flush()
	}
	if len(r.Processes) > 0 {
		fmt.Fprintln(stdio.Out)
		w = cli.NewTable(stdio.Out)
		fmt.Fprintf(w, "consumer processes\tjobs/s\t× 1 process\tCPU s/1000 jobs\tmachine CPU s/1000\tledger commits/job\tpeak RSS MiB (one process)\n")
		for _, p := range r.Processes {
			fmt.Fprintf(w, "%d\t%.0f\t%.2f\t%.3f\t%.3f\t%.2f\t%.0f\n", p.N, p.JobsPerS, p.JobsPerS/r.Processes[0].JobsPerS,
				p.CPUPer1000, p.MachineCPU, p.CommitsPerJob, p.PeakRSSMiB)
		}
		w.Flush()
	}
	if m := r.Memory; m != nil {
		fmt.Fprintf(stdio.Out, "\nmemory: one consumer process at %d/s for %s (%d jobs): RSS %.0f MiB after warm-up, %.0f MiB at the end (%+.1f%%), %.0f MiB at most\n",
			m.Rate, time.Duration(m.Seconds*float64(time.Second)), m.Jobs, m.StartMiB, m.EndMiB, m.GrowthPct, m.MaxMiB)
	}
}

// benchJSON is the last line of --json: the figures a script compares.
func benchJSON(r *bench.Report) map[string]any {
	perN := map[string]float64{}
	for _, p := range r.Processes {
		perN[strconv.Itoa(p.N)] = p.JobsPerS
	}
	out := map[string]any{
		"naive_jobs_per_s": r.Naive.JobsPerS, "fresh_jobs_per_s": r.Fresh.JobsPerS,
		"duplicate_jobs_per_s": r.Duplicate.JobsPerS, "slow_jobs_per_s": r.Slow.JobsPerS,
		"fresh_p99_ms": r.ToolqLat.P99ms, "naive_p99_ms": r.NaiveLat.P99ms, "rate": r.ToolqLat.Rate,
		"fresh_p50_ms_at_100": r.ToolqLat100.P50ms, "naive_p50_ms_at_100": r.NaiveLat100.P50ms,
		"processes_jobs_per_s": perN,
		"report":               r,
	}
	if r.Memory != nil {
		out["memory_growth_pct"] = r.Memory.GrowthPct
	}
	return out
}

// known prints a CPU figure, or "-" when it was not measured.
func known(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", v)
}

// knownInt prints v to the unit, or "-" for 0 (not known).
func knownInt(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

// stealMarked is the difference in steal, in points, from which a run's
// ratio to its naive run is printed with it.
const stealMarked = 2.0

// naiveRatios prints each run's ratio to its naive run, with the
// difference of their steal where it is stealMarked points or more.
func naiveRatios(rs, stealOver []float64) string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = fmt.Sprintf("%.2f", r)
		if i < len(stealOver) && math.Abs(stealOver[i]) >= stealMarked {
			out[i] += fmt.Sprintf(" (steal %+.1f)", stealOver[i])
		}
	}
	return strings.Join(out, " ")
}

// unequalSteal reports whether a run's steal differs from its naive run's
// by stealMarked points or more.
func unequalSteal(stealOver []float64) bool {
	return slices.ContainsFunc(stealOver, func(d float64) bool { return math.Abs(d) >= stealMarked })
}

// repRatios divides each of b's figures by a's of the same rep, and
// returns the median of those ratios and the ratios, printed.
func repRatios(b, a []float64) (float64, string) {
	var ratios []float64
	var out []string
	for i := range min(len(a), len(b)) {
		ratios = append(ratios, b[i]/a[i])
		out = append(out, fmt.Sprintf("%.2f", b[i]/a[i]))
	}
	if len(ratios) == 0 {
		return 0, ""
	}
	slices.Sort(ratios)
	return ratios[len(ratios)/2], strings.Join(out, " ")
}

// naiveCommand is the hidden command the bench re-executes this binary
// with, so that the naive dispatcher runs in a process of its own, as
// toolq's consumer does.
const naiveCommand = "__bench-naive"

// runNaive is that process: the naive dispatcher until SIGTERM.
func runNaive(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet(naiveCommand, "the bench's naive dispatcher", stdio)
	var cfg bench.NaiveConfig
	cfg.Flags(fs)
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	cli.SetServiceGC(getenv) // the consumer's garbage collection, as every other setting
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return bench.RunNaive(ctx, cfg, stdio.Out)
}

// natsServerCommand is the hidden command the bench re-executes this binary
// with, so that the server under test runs in a process of its own.
const natsServerCommand = "__bench-nats-server"

// startNATSProcess starts a nats-server with JetStream in a child process
// and returns its URL.
func startNATSProcess() (string, int, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", 0, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", 0, nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "toolq-bench-nats-")
	if err != nil {
		return "", 0, nil, err
	}
	cmd := exec.Command(self, natsServerCommand, strconv.Itoa(port), dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		os.RemoveAll(dir)
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return url, cmd.Process.Pid, stop, nil
		}
	}
	stop()
	return "", 0, nil, errors.New("the nats-server process did not listen within 20s")
}

// runNATSServer is the child: a nats-server with JetStream on port, its
// store in dir, until SIGTERM.
func runNATSServer(port, dir string) error {
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: p, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		return err
	}
	go srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		return errors.New("nats-server not ready")
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	srv.Shutdown()
	srv.WaitForShutdown()
	return nil
}

// parseCounts reads "1,2,4".
func parseCounts(s string) ([]int, error) {
	out := []int{}
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a process count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// besideSelf is the path of the executable name in this binary's
// directory, or "" when there is none.
func besideSelf(name string) string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(self), name)
	if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return ""
	}
	return p
}
