// Package bench measures what toolq's exactly-once effects cost, against
// the system a user has without toolq: a naive dispatcher that pulls a job,
// runs the tool, publishes the result and acks, with no memory. Both run in
// one process against the same NATS server, the same sandbox payments API
// over HTTP and (for toolq) a Postgres ledger with synchronous commit, so
// that the figures are ratios measured in one run.
package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// Config says what to measure and against what.
type Config struct {
	NATSURL     string // a running server (the caller starts one otherwise)
	DatabaseURL string // a Postgres database for the ledger
	Jobs        int    // jobs per throughput run (default 20,000)
	Reps        int    // runs of each throughput scenario; the median is reported (default 3)
	Concurrency int    // tool calls at once, and 4 × as many jobs in flight, for toolq and the naive dispatcher alike (default 64)
	SlowLatency time.Duration
	// Rate is the fixed rate of the latency runs, jobs/s (0: half of
	// toolq's fresh throughput).
	Rate       int
	LatencyFor time.Duration // how long each latency run publishes (default 10s)
	// WarmUp is how long each latency run publishes at its rate, uncounted,
	// before its counted jobs (0: 1s; negative: none).
	WarmUp time.Duration
	// Settle is how long each throughput and latency run waits at most,
	// before it starts, for the machine to go idle (0: 5s; negative: no
	// wait).
	Settle time.Duration
	// ConsumerBin is the consumer binary the scaling and memory runs start
	// as separate processes (empty: those runs are not made).
	ConsumerBin string
	Processes   []int         // consumer process counts of the scaling runs (default 1, 2, 4)
	MemoryFor   time.Duration // how long the memory run lasts at the fixed rate (0: no memory run)
	// NaiveCmd is the command line that runs the naive dispatcher as a
	// process (RunNaive's flags are appended); nil, or InProcess: it runs
	// in this process.
	NaiveCmd []string
	// InProcess runs toolq's workers and the naive dispatcher in this
	// process, sharing its scheduler and memory (for a CPU profile of
	// everything); otherwise each runs as a process of its own, toolq as
	// ConsumerBin (in this process when there is none).
	InProcess bool
	// CompareBin is a second consumer binary: the fresh, duplicate and
	// latency runs are made with both builds, interleaved, and the ratios
	// reported (Report.Compare).
	CompareBin string
	// ComparePlain puts the plain ledger dispatcher (NaiveConfig.LedgerURL)
	// where CompareBin's build would be: its fresh, duplicate and latency
	// runs are made beside the consumer's, on a table of its own in the
	// same Postgres.
	ComparePlain bool
	NATSPID      int // the nats-server's process, for its CPU figure (0: unknown)
	// ProfileDir, when set, gets a CPU profile of every consumer process
	// (SCENARIO-REP[-N].prof) and its allocations since its start
	// (SCENARIO-REP[-N].allocs); of a latency run's, a CPU profile, an
	// execution trace and the allocations of its counted jobs' window
	// (latency-RATE[-compared][-2].prof, .trace, .allocs).
	ProfileDir string
	Logger     *slog.Logger // progress lines (nil: none)
}

func (c *Config) fill() {
	if c.Jobs <= 0 {
		c.Jobs = 20000
	}
	if c.Reps <= 0 {
		c.Reps = 3
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 64
	}
	if c.SlowLatency <= 0 {
		c.SlowLatency = 50 * time.Millisecond
	}
	if c.Settle == 0 {
		c.Settle = 5 * time.Second
	}
	if c.LatencyFor <= 0 {
		c.LatencyFor = 10 * time.Second
	}
	if c.WarmUp == 0 {
		c.WarmUp = time.Second
	}
	if c.Processes == nil {
		c.Processes = []int{1, 2, 4}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Throughput is one scenario's figures, the median of its runs. CPU
// figures are seconds per 1,000 jobs.
type Throughput struct {
	JobsPerS float64 `json:"jobs_per_s"`
	// CPUPer1000 is the consumer's: the consumer processes (or the naive
	// dispatcher's), or this whole process when they run in it.
	CPUPer1000  float64 `json:"cpu_s_per_1000"`
	DriverCPU   float64 `json:"driver_cpu_s_per_1000"`   // this process: publishing, the result watch, the sandbox (0 in process)
	NATSCPU     float64 `json:"nats_cpu_s_per_1000"`     // the nats-server process (0: not known)
	PostgresCPU float64 `json:"postgres_cpu_s_per_1000"` // the ledger's Postgres server, every process of it (0: not known)
	MachineCPU  float64 `json:"machine_cpu_s_per_1000"`  // the whole machine
	// StealPct is the share of the machine's time the hypervisor gave to
	// other machines during the run (/proc/stat's steal): on a shared VM it
	// moves from run to run, and the run's speed with it.
	StealPct      float64 `json:"steal_pct"`
	CommitsPerJob float64 `json:"ledger_commits_per_job"`     // Postgres transactions per job (pg_stat_database)
	FlushesPerJob float64 `json:"ledger_wal_flushes_per_job"` // WAL flushes to disk per job (pg_stat_wal)
	PeakRSSMiB    float64 `json:"peak_rss_mib"`
	Payments      int     `json:"payments"` // payments the sandbox made in the run reported (a duplicate makes none)
	// AllocsPerJob and AllocBytesPerJob are the heap objects and bytes the
	// consumer processes (or the naive dispatcher's) allocated per job while
	// the run took its jobs (0: not known; in process). Unlike time and
	// CPU they hardly move with the machine, so a comparison of two builds
	// shows a change of a few per cent in them.
	AllocsPerJob     float64   `json:"consumer_allocs_per_job"`
	AllocBytesPerJob float64   `json:"consumer_alloc_bytes_per_job"`
	Runs             []float64 `json:"runs_jobs_per_s"`
	RunsSteal        []float64 `json:"runs_steal_pct"` // each run's StealPct, in the order of Runs
	// NaiveRatios are each run's jobs/s ÷ the naive dispatcher's run made
	// just before it, for the runs that follow one (every fresh and
	// duplicate run of the consumer; not every run of a compared build):
	// the machine's speed drifts over seconds, and a ratio of neighbours
	// cancels it.
	NaiveRatios []float64 `json:"runs_x_naive,omitempty"`
	// StealOverNaive is, for each of NaiveRatios, the run's steal less
	// that of the naive run it is divided by (StealPct, in points; 0 when
	// either was not read): a run whose machine lost more to steal than
	// its naive run's has a ratio the machine lowered, one that lost less a
	// ratio it raised.
	StealOverNaive []float64 `json:"runs_steal_over_naive_pct,omitempty"`
}

// XNaive is the median of the run's NaiveRatios (0 without any).
func (t Throughput) XNaive() float64 {
	if len(t.NaiveRatios) == 0 {
		return 0
	}
	r := slices.Sorted(slices.Values(t.NaiveRatios))
	return r[len(r)/2]
}

// Latency is the publish-to-result latency at a fixed rate.
type Latency struct {
	Rate int `json:"rate"`
	Jobs int `json:"jobs"`
	// Ledger is how long the ledger's statements took on the Postgres
	// server during the run, by kind (pg_stat_statements; empty when the
	// server does not have it).
	Ledger []StatementTime `json:"ledger_statements,omitempty"`
	// StealPct is the share of the machine's time the hypervisor took
	// while the run's counted jobs were sent and answered (/proc/stat).
	StealPct float64 `json:"steal_pct"`
	P50, P90 float64 `json:"-"`
	P99, Max float64 `json:"-"`
	P50ms    float64 `json:"p50_ms"`
	P90ms    float64 `json:"p90_ms"`
	P99ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
}

// Report is everything one run measured.
type Report struct {
	Jobs        int        `json:"jobs"`
	Concurrency int        `json:"concurrency"`
	Naive       Throughput `json:"naive"`
	Fresh       Throughput `json:"fresh"`
	Duplicate   Throughput `json:"duplicate"`
	Slow        Throughput `json:"slow"`
	SlowBound   float64    `json:"slow_bound_jobs_per_s"` // concurrency / tool latency
	NaiveLat    Latency    `json:"naive_latency"`
	ToolqLat    Latency    `json:"toolq_latency"`
	NaiveLat100 Latency    `json:"naive_latency_100"`
	ToolqLat100 Latency    `json:"toolq_latency_100"`
	// Phases is where toolq's latency at the fixed rate goes, from its
	// spans in a run of its own (tracing costs a little: its end-to-end
	// figure is a little above ToolqLat's).
	Phases    []Phase `json:"toolq_latency_phases,omitempty"`
	Phases100 []Phase `json:"toolq_latency_phases_100,omitempty"` // the same at 100 jobs/s
	// Processes are the scaling runs (consumer processes on one durable),
	// Memory the long run at the fixed rate; both need Config.ConsumerBin.
	Processes []Processes `json:"processes,omitempty"`
	Memory    *Memory     `json:"memory,omitempty"`
	// InProcess says the consumer and the naive dispatcher ran in the
	// bench's own process.
	InProcess bool        `json:"in_process"`
	Compare   *Comparison `json:"compare,omitempty"`
}

// Comparison is the second build's figures (Config.CompareBin, or the
// plain ledger dispatcher's), from runs interleaved with the first's in
// the same bench.
type Comparison struct {
	Bin       string     `json:"bin"` // the binary, or "plain ledger dispatcher"
	Fresh     Throughput `json:"fresh"`
	Duplicate Throughput `json:"duplicate"`
	Lat       Latency    `json:"latency"`
	Lat100    Latency    `json:"latency_100"`
}

// bench is one run's shared parts.
type bench struct {
	cfg Config
	// sample reads the CPU figures of a throughput run's start and end
	// (nil: sampleCPU, the machine's; tests set another).
	sample  func(natsPID, pgPID int) cpuSample
	nc      *nats.Conn
	js      jetstream.JetStream
	store   *ledger.Store
	pg      *pgx.Conn
	pgPID   int // the ledger's postmaster (0: not on this machine)
	sandbox *sandbox.Server
	url     string // the sandbox's base URL
	client  *http.Client
	results *resultWatch
	seq     atomic.Int64
	// run names this bench's calls apart from an earlier bench's on the
	// same --database-url, whose ledger has them completed.
	run   string
	quiet *slog.Logger // the worker's: warnings and errors only

	dir                 string  // the run's files
	profileName         string  // the profile files' name for the run under way
	toolsFile           string  // the consumer processes' registry
	childCPU, childPeak float64 // the last run's processes under test: CPU seconds, peak RSS MiB
	// childMallocs and childAllocBytes are the heap objects and bytes the
	// last run's processes allocated for its childJobs jobs, their start-up
	// aside (0: not known).
	childMallocs, childAllocBytes float64
	childJobs                     int
	// startups is what one process of each binary (its path, or "naive")
	// allocates to start and become ready, measured before the runs.
	startups map[string]allocation
}

// build is one consumer build under test: its binary ("" in process) and
// the tools its jobs go to. The second build of a comparison has tools of
// its own, so that neither takes the other's jobs nor finds its calls in
// the ledger.
type build struct {
	bin       string
	plain     bool // the plain ledger dispatcher (bin is not used)
	pay, slow string
}

// Run measures every scenario (the throughput ones Reps times, their runs
// interleaved) and returns the figures.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.fill()
	b := &bench{cfg: cfg, quiet: slog.New(levelFilter{cfg.Logger.Handler()}), run: strconv.FormatInt(time.Now().UnixNano(), 36)}
	var err error
	if b.nc, err = nats.Connect(cfg.NATSURL); err != nil {
		return nil, fmt.Errorf("bench: nats: %w", err)
	}
	defer b.nc.Close()
	if b.js, err = jetstream.New(b.nc); err != nil {
		return nil, err
	}
	if b.store, err = ledger.Open(ctx, cfg.DatabaseURL, ""); err != nil {
		return nil, err
	}
	defer b.store.Close()
	if err := b.store.Migrate(ctx); err != nil {
		return nil, err
	}
	if b.pg, err = pgx.Connect(ctx, cfg.DatabaseURL); err != nil {
		return nil, err
	}
	defer b.pg.Close(context.Background())
	b.pgPID = b.postmasterPID(ctx)
	if b.sandbox, err = sandbox.New(sandbox.Config{}); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: b.sandbox}
	go srv.Serve(ln)
	defer srv.Close()
	b.url = "http://" + ln.Addr().String()
	b.client = toolClient(cfg.Concurrency)
	if err := jobs.ProvisionStreams(ctx, b.js, jobs.Streams{}); err != nil {
		return nil, err
	}
	if b.results, err = watchResults(b.nc); err != nil {
		return nil, err
	}
	defer b.results.stop()
	if b.dir, err = os.MkdirTemp("", "toolq-bench-"); err != nil {
		return nil, err
	}
	defer os.RemoveAll(b.dir)
	if b.toolsFile, err = b.writeTools(b.dir); err != nil {
		return nil, err
	}
	// Every binary run as processes: the consumer's (the scaling and
	// memory runs start it with InProcess too), the compared build's, the
	// naive dispatcher's.
	if err := b.measureStartups(ctx, !cfg.InProcess && len(cfg.NaiveCmd) > 0, cfg.ComparePlain,
		slices.DeleteFunc([]string{cfg.ConsumerBin, cfg.CompareBin}, func(bin string) bool { return bin == "" })...); err != nil {
		return nil, err
	}

	// A machine that stops running this process for a while (a shared VM
	// descheduled, paused or snapshotted) makes a run slow for reasons of
	// its own: say so, so that such a run is not read as toolq's figure.
	stopWatch := watchStalls(cfg.Logger)
	defer stopWatch()
	r := &Report{Jobs: cfg.Jobs, Concurrency: cfg.Concurrency, InProcess: cfg.InProcess || cfg.ConsumerBin == ""}
	a := build{bin: cfg.ConsumerBin, pay: "pay", slow: "slow"}
	if r.InProcess {
		a.bin = ""
	}
	var other build
	if cfg.CompareBin != "" {
		other = build{bin: cfg.CompareBin, pay: "pay_b"}
		r.Compare = &Comparison{Bin: cfg.CompareBin}
	} else if cfg.ComparePlain {
		other = build{plain: true, pay: "pay_b"}
		r.Compare = &Comparison{Bin: "plain ledger dispatcher"}
	}
	scenarios := b.scenarios(r, a, other)
	if err := b.measure(ctx, scenarios); err != nil {
		return nil, err
	}
	r.SlowBound = float64(cfg.Concurrency) / cfg.SlowLatency.Seconds()
	rate := cfg.Rate
	if rate <= 0 {
		rate = max(int(r.Fresh.JobsPerS/2), 1)
	}
	if err := b.latencies(ctx, r, rate, a, other); err != nil {
		return nil, err
	}
	if r.Phases, err = b.phases(ctx, rate); err != nil {
		return nil, fmt.Errorf("bench: latency phases at %d/s: %w", rate, err)
	}
	if r.Phases100, err = b.phases(ctx, 100); err != nil {
		return nil, fmt.Errorf("bench: latency phases at 100/s: %w", err)
	}
	if cfg.ConsumerBin == "" {
		return r, nil
	}
	for _, n := range cfg.Processes {
		p := Processes{N: n}
		if err := b.measure(ctx, []scenario{{name: fmt.Sprintf("processes-%d", n), into: &p.Throughput, run: b.processesRun(n)}}); err != nil {
			return nil, err
		}
		r.Processes = append(r.Processes, p)
	}
	if cfg.MemoryFor > 0 {
		b.cfg.Logger.Info("bench memory run", "rate", rate, "for", cfg.MemoryFor)
		b.profileName = "memory"
		m, err := b.memory(ctx, rate, cfg.MemoryFor)
		if err != nil {
			return nil, fmt.Errorf("bench: memory run: %w", err)
		}
		r.Memory = &m
	}
	return r, nil
}

// scenario is one throughput scenario: its run for rep returns how long it
// took and how many of its jobs that time covers (0: all of them).
// Compared marks the runs of a comparison's second build, with the naive
// runs made before them.
type scenario struct {
	name     string
	into     *Throughput
	run      func(ctx context.Context, rep int) (time.Duration, int, error)
	compared bool
}

// scenarios are the throughput scenarios of one rep. The naive dispatcher
// runs before fresh and again before duplicate, so that each of toolq's
// runs has a naive run right before it to be divided by. The compared
// build (r.Compare set) runs the same sequence: its runs then follow what
// the first build's follow, which is what makes the two comparable (when
// its duplicate followed its fresh run directly, and the first build's
// followed a naive run, the same build compared with itself ran
// duplicates 1.14 × as fast).
func (b *bench) scenarios(r *Report, a, other build) []scenario {
	s := []scenario{
		{name: "naive", into: &r.Naive, run: b.naiveRun},
		{name: "fresh", into: &r.Fresh, run: b.freshRun(a, 0)},
		{name: "naive", into: &r.Naive, run: b.naiveRun},
		{name: "duplicate", into: &r.Duplicate, run: b.duplicateRun(a, 0)},
		{name: "slow", into: &r.Slow, run: b.slowRun(a)},
	}
	if r.Compare == nil {
		return s
	}
	return append(s,
		scenario{name: "naive", into: &r.Naive, run: b.naiveRun, compared: true},
		scenario{name: "fresh (compared)", into: &r.Compare.Fresh, run: b.freshRun(other, 500), compared: true},
		scenario{name: "naive", into: &r.Naive, run: b.naiveRun, compared: true},
		scenario{name: "duplicate (compared)", into: &r.Compare.Duplicate, run: b.duplicateRun(other, 500), compared: true})
}

// measure runs each scenario Reps times, the scenarios of one rep one after
// the other (so that the runs compared were made as close in time as the
// machine allows), and keeps each scenario's median.
func (b *bench) measure(ctx context.Context, scenarios []scenario) error {
	type sample struct {
		perS, cpu, driver, nats, postgres, machine, steal, commits, flushes, peak float64
		stealKnown                                                                bool // both /proc/stat readings succeeded
		allocs, allocBytes                                                        float64
		payments                                                                  int
	}
	samples := map[*Throughput][]sample{} // a scenario may run twice a rep (the naive dispatcher's)
	var into []*Throughput                // in the order first run
	for rep := range b.cfg.Reps {
		lastNaive := 0.0            // the naive run made last in this rep
		var lastNaiveSteal *float64 // its steal, if known
		for _, i := range b.order(scenarios, rep) {
			s := scenarios[i]
			n := b.cfg.Jobs
			if s.name == "slow" {
				n = min(n, b.cfg.Concurrency*40)
			}
			b.settle(ctx) // before the run's figures start: the wait is not the run's
			readCPU := b.sample
			if readCPU == nil {
				readCPU = sampleCPU
			}
			cpu0, commits0, flushes0, payments0 := readCPU(b.cfg.NATSPID, b.pgPID), b.commits(ctx), b.walFlushes(ctx), len(b.sandbox.Payments())
			var elapsed time.Duration
			var counted int
			var err error
			b.childCPU, b.childPeak, b.childMallocs, b.childAllocBytes, b.childJobs = 0, 0, 0, 0, 0
			b.profileName = fmt.Sprintf("%s-%d", strings.ReplaceAll(strings.Trim(s.name, ")"), " (", "-"), rep+1)
			// The scenario labels its samples in a CPU profile (go tool pprof
			// -tagfocus scenario=duplicate).
			pprof.Do(ctx, pprof.Labels("scenario", s.name), func(ctx context.Context) { elapsed, counted, err = s.run(ctx, rep) })
			if err != nil {
				return fmt.Errorf("bench: %s: %w", s.name, err)
			}
			if counted == 0 {
				counted = n
			}
			time.Sleep(300 * time.Millisecond) // the closed connections' statistics reach pg_stat_database
			cpu1 := readCPU(b.cfg.NATSPID, b.pgPID)
			per := func(d float64) float64 { return d / float64(n) * 1000 }
			spent := cpu1.machineTime.since(cpu0.machineTime) // zero if a reading failed
			m := sample{perS: float64(counted) / elapsed.Seconds(), driver: per(cpu1.driver - cpu0.driver), nats: per(cpu1.nats - cpu0.nats),
				postgres: per(cpu1.postgres - cpu0.postgres), machine: per(cpu1.machine - cpu0.machine), steal: spent.stealPct(), stealKnown: spent.all > 0,
				commits: float64(b.commits(ctx)-commits0) / float64(n), flushes: float64(b.walFlushes(ctx)-flushes0) / float64(n),
				payments: len(b.sandbox.Payments()) - payments0, peak: b.childPeak,
				allocs: perJob(b.childMallocs, b.childJobs), allocBytes: perJob(b.childAllocBytes, b.childJobs)}
			if b.childCPU > 0 { // processes of their own
				m.cpu = per(b.childCPU)
			} else { // in this process: everything it did
				m.cpu, m.driver, m.peak = m.driver, 0, peakRSSMiB()
			}
			if _, ok := samples[s.into]; !ok {
				into = append(into, s.into)
			}
			samples[s.into] = append(samples[s.into], m)
			s.into.Runs = append(s.into.Runs, m.perS)
			s.into.RunsSteal = append(s.into.RunsSteal, m.steal)
			switch {
			case s.name == "naive":
				lastNaive, lastNaiveSteal = m.perS, nil
				if m.stealKnown {
					lastNaiveSteal = &m.steal
				}
			case lastNaive > 0 && s.name != "slow":
				s.into.NaiveRatios = append(s.into.NaiveRatios, m.perS/lastNaive)
				over := 0.0 // not known: nothing to say
				if m.stealKnown && lastNaiveSteal != nil {
					over = m.steal - *lastNaiveSteal
				}
				s.into.StealOverNaive = append(s.into.StealOverNaive, over)
			}
			if s.name != "naive" { // a ratio is to the run right before: no other
				lastNaive = 0
			}
			b.cfg.Logger.Info("bench run", "scenario", s.name, "rep", rep+1, "jobs_per_s", int(m.perS), "cpu_s_per_1000", fmt.Sprintf("%.3f", m.cpu),
				"steal_pct", fmt.Sprintf("%.1f", m.steal))
		}
	}
	for _, t := range into {
		ss := samples[t]
		slices.SortFunc(ss, func(a, b sample) int { return cmp.Compare(a.perS, b.perS) })
		m := ss[len(ss)/2]
		*t = Throughput{JobsPerS: m.perS, CPUPer1000: m.cpu, DriverCPU: m.driver, NATSCPU: m.nats, PostgresCPU: m.postgres, MachineCPU: m.machine, StealPct: m.steal,
			CommitsPerJob: m.commits, FlushesPerJob: m.flushes, PeakRSSMiB: m.peak, Payments: m.payments, Runs: t.Runs, RunsSteal: t.RunsSteal, NaiveRatios: t.NaiveRatios,
			StealOverNaive: t.StealOverNaive}
		// Allocations hardly move with the machine's speed: their median
		// of their own, not the median run's, over the runs that have them.
		t.AllocsPerJob = knownMedian(ss, func(s sample) float64 { return s.allocs })
		t.AllocBytesPerJob = knownMedian(ss, func(s sample) float64 { return s.allocBytes })
	}
	return nil
}

// knownMedian is the median of f over ss, leaving out 0 (not known); 0
// if none is known.
func knownMedian[T any](ss []T, f func(T) float64) float64 {
	var v []float64
	for _, s := range ss {
		if x := f(s); x != 0 {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// perJob is total over jobs, or 0 (not known) without either.
func perJob(total float64, jobs int) float64 {
	if total <= 0 || jobs <= 0 {
		return 0
	}
	return total / float64(jobs)
}

// order is the order of the scenarios' runs in rep: as given, but in a
// comparison every other rep runs the compared build's sequence first, so
// that neither build always runs on a machine the other has just warmed.
func (b *bench) order(scenarios []scenario, rep int) []int {
	var mine, compared []int
	for i, s := range scenarios {
		if s.compared {
			compared = append(compared, i)
		} else {
			mine = append(mine, i)
		}
	}
	if rep%2 == 0 {
		return append(mine, compared...)
	}
	return append(compared, mine...)
}

// The scenarios. Each publishes its jobs first (a backlog), then starts
// its consumer and times until every job has its result.

func (b *bench) naiveRun(ctx context.Context, rep int) (time.Duration, int, error) {
	batch := b.jobsFor("naive_pay", rep, b.cfg.Jobs, false)
	if err := b.publishAll(ctx, batch); err != nil {
		return 0, 0, err
	}
	return b.timed(ctx, batch, b.naiveStarter("naive_pay", false))
}

// freshRun runs the calls of rep+offset, new to the ledger.
func (b *bench) freshRun(of build, offset int) func(context.Context, int) (time.Duration, int, error) {
	return func(ctx context.Context, rep int) (time.Duration, int, error) {
		batch := b.jobsFor(of.pay, rep+offset, b.cfg.Jobs, false)
		if err := b.publishAll(ctx, batch); err != nil {
			return 0, 0, err
		}
		return b.timed(ctx, batch, b.toolqStarter(of, of.pay, 1, nil))
	}
}

// duplicateRun sends again the calls the fresh run of the same rep
// completed: a retried turn sends each again with a new tool_use_id.
func (b *bench) duplicateRun(of build, offset int) func(context.Context, int) (time.Duration, int, error) {
	return func(ctx context.Context, rep int) (time.Duration, int, error) {
		batch := b.jobsFor(of.pay, rep+offset, b.cfg.Jobs, true)
		if err := b.publishAll(ctx, batch); err != nil {
			return 0, 0, err
		}
		return b.timed(ctx, batch, b.toolqStarter(of, of.pay, 1, nil))
	}
}

func (b *bench) slowRun(of build) func(context.Context, int) (time.Duration, int, error) {
	return func(ctx context.Context, rep int) (time.Duration, int, error) {
		batch := b.jobsFor(of.slow, rep, min(b.cfg.Jobs, b.cfg.Concurrency*40), false)
		if err := b.publishAll(ctx, batch); err != nil {
			return 0, 0, err
		}
		return b.timed(ctx, batch, b.toolqStarter(of, of.slow, 1, nil))
	}
}

// jobsFor makes n jobs for tool: the calls of run rep of this bench, with
// tool_use_ids new to this batch (retry: the same calls as an earlier
// batch).
func (b *bench) jobsFor(tool string, rep, n int, _ bool) []*jobs.Job {
	out := make([]*jobs.Job, n)
	batch := b.seq.Add(1)
	for i := range out {
		args := fmt.Sprintf(`{"invoice_id":"inv-%s-%s-%d-%d","amount_cents":100,"currency":"EUR"}`, b.run, tool, rep, i)
		out[i] = &jobs.Job{ConversationID: fmt.Sprintf("bench-%d", i%512), TurnIndex: int64(i / 512), Tool: tool,
			ToolUseID: fmt.Sprintf("toolu_%d_%d", batch, i), Args: json.RawMessage(args)}
	}
	return out
}

func (b *bench) publishAll(ctx context.Context, batch []*jobs.Job) error {
	client := jobs.NewClient(b.js)
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	var first error
	var mu sync.Mutex
	for _, j := range batch {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := client.Publish(ctx, j); err != nil {
				mu.Lock()
				first = errors.Join(first, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// running is what takes a scenario's jobs: consumer processes, a worker in
// this process, or the naive dispatcher.
type running struct {
	ready  time.Time       // when it took jobs
	exited <-chan struct{} // closed if it stops on its own
	// debug is the address of each of its consumer processes' Go
	// profiles (--debug-pprof on their --health-addr; none in this
	// process or for the naive dispatcher).
	debug []string
	// stop stops it and returns its processes' CPU seconds and largest
	// peak RSS (zeros in this process).
	stop func() (cpu, peakMiB float64, err error)
}

// starter starts what takes a scenario's jobs, and returns once it takes
// them.
type starter func(ctx context.Context) (*running, error)

// timed starts what takes the jobs of a published batch, and returns the
// time from its being ready to the last result, and how many results came
// in that time: a process's start-up is not its throughput. When most
// jobs were answered while it started (a small batch), the whole run is
// timed, start-up included.
func (b *bench) timed(ctx context.Context, batch []*jobs.Job, start starter) (time.Duration, int, error) {
	want := make(map[string]bool, len(batch))
	for _, j := range batch {
		want[j.ToolUseID] = true
	}
	done := b.results.expect(want)
	started := time.Now()
	r, err := start(ctx)
	if err != nil {
		return 0, 0, err
	}
	stopped := false
	defer func() {
		if !stopped {
			r.stop()
		}
	}()
	select {
	case <-done:
	case <-r.exited:
		return 0, 0, errors.New("what took the jobs stopped on its own")
	case <-b.results.failed:
		return 0, 0, b.results.err
	case <-time.After(10 * time.Minute):
		return 0, 0, fmt.Errorf("%d of %d results after 10 minutes", len(batch)-b.results.missing(), len(batch))
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	var last time.Time
	counted := 0
	for _, at := range b.results.arrivals(want) {
		if at.After(r.ready) {
			counted++
		}
		if at.After(last) {
			last = at
		}
	}
	stopped = true
	cpu, peak, err := r.stop()
	if err != nil {
		return 0, 0, err
	}
	b.childCPU, b.childPeak, b.childJobs = cpu, peak, len(batch)
	if counted < len(batch)/2 {
		return last.Sub(started), len(batch), nil
	}
	return last.Sub(r.ready), counted, nil
}

// settle waits, up to Settle, for the machine to be idle (under a fifth of
// a core busy over 200ms) before a throughput run starts, and before its
// figures are sampled: the run before it leaves work behind (Postgres
// writing out and vacuuming its rows) that would otherwise slow down, and
// be counted against, whichever run comes next.
func (b *bench) settle(ctx context.Context) {
	if b.cfg.Settle < 0 {
		return
	}
	deadline := time.Now().Add(b.cfg.Settle)
	for last := machineCPUSeconds(); time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(200 * time.Millisecond)
		now := machineCPUSeconds()
		if now-last < 0.2*0.2 {
			return
		}
		last = now
	}
	b.cfg.Logger.Info("bench: the machine did not go idle; the run starts anyway", "waited", b.cfg.Settle)
}

// toolqStarter starts toolq on one tool's jobs: n consumer processes of
// the build, or (no binary, or tp set: spans recorded here) a worker in
// this process.
func (b *bench) toolqStarter(of build, tool string, n int, tp trace.TracerProvider) starter {
	if of.plain {
		return b.naiveStarter(tool, true)
	}
	if of.bin == "" || tp != nil {
		return func(ctx context.Context) (*running, error) {
			ready := time.Now()
			stop, err := b.startToolqTraced(ctx, tool, tp)
			if err != nil {
				return nil, err
			}
			return &running{ready: ready, stop: func() (float64, float64, error) { stop(); return 0, 0, nil }}, nil
		}
	}
	return func(ctx context.Context) (*running, error) {
		procs, err := b.startProcs(ctx, of.bin, "bench-toolq-"+tool, tool, n)
		if err != nil {
			stopProcs(procs)
			return nil, err
		}
		name := b.profileName
		allocs := b.countAllocs(ctx, procs, of.bin)
		ready := time.Now()
		var debug []string
		for _, p := range procs {
			debug = append(debug, p.health)
		}
		return &running{ready: ready, exited: exited(procs), debug: debug, stop: func() (float64, float64, error) {
			allocs()
			if b.cfg.ProfileDir != "" && !isLatencyRun(name) { // a latency run's are of its counted jobs (captureCounted)
				b.saveAllocs(ctx, procs, name)
			}
			return stopProcs(procs)
		}}, nil
	}
}

// countAllocs returns the function that, called before the processes (of
// the binary startup names) stop, sets the run's allocations
// (childMallocs, childAllocBytes) to what they allocated in their lives
// less what each allocated to start (b.startups): what they allocated for
// the run's jobs, every one of which they took, including those taken
// before the last of them was ready. Both stay 0 if a process did not
// answer or the start-up is not known.
func (b *bench) countAllocs(ctx context.Context, procs []*consumerProc, startup string) func() {
	return func() {
		objects, bytes, ok := b.mallocs(ctx, procs)
		base, known := b.startups[startup]
		if ok && known {
			n := float64(len(procs))
			b.childMallocs, b.childAllocBytes = max(objects-n*base.objects, 0), max(bytes-n*base.bytes, 0)
		}
	}
}

// allocation is what a process allocated: heap objects and bytes.
type allocation struct{ objects, bytes float64 }

// measureStartups measures, for each binary the runs start, what one
// process allocates from its start until it is ready, on a tool no job is
// published to (idle); countAllocs takes it off each run's processes. A
// build that does not answer (one from before /debug/vars) is measured
// all the same, its allocations not known.
func (b *bench) measureStartups(ctx context.Context, naive, plain bool, bins ...string) error {
	b.startups = map[string]allocation{}
	measure := func(key string, procs []*consumerProc, err error) error {
		defer stopProcs(procs)
		if err != nil {
			return err
		}
		if objects, bytes, ok := b.mallocs(ctx, procs); ok {
			b.startups[key] = allocation{objects, bytes}
		}
		return nil
	}
	for i, bin := range bins {
		b.profileName = fmt.Sprintf("startup-%d", i+1) // its CPU profile's, with ProfileDir
		procs, err := b.startProcs(ctx, bin, "bench-idle", "idle", 1)
		if err := measure(bin, procs, err); err != nil {
			return err
		}
	}
	if !naive {
		return nil
	}
	ledgers := []bool{false} // the naive dispatcher's
	if plain {
		ledgers = append(ledgers, true) // the plain ledger dispatcher's
	}
	for _, ledger := range ledgers {
		p, err := b.startNaiveProc(ctx, b.naiveConfig("idle", ledger))
		var procs []*consumerProc
		if p != nil {
			procs = append(procs, p)
		}
		if err := measure(naiveStartup(ledger), procs, err); err != nil {
			return err
		}
	}
	return nil
}

// naiveConfig is the naive dispatcher's on one tool's jobs, with the
// bench's settings; ledger: the plain ledger dispatcher's, on the
// ledger's Postgres.
func (b *bench) naiveConfig(tool string, ledger bool) NaiveConfig {
	cfg := NaiveConfig{NATSURL: b.cfg.NATSURL, ToolURL: b.url + "/v1/payments", Tool: tool, Durable: "bench-naive-" + tool,
		Workers: 4 * b.cfg.Concurrency, Concurrency: b.cfg.Concurrency}
	if ledger {
		cfg.LedgerURL, cfg.Durable = b.cfg.DatabaseURL, "bench-plain-"+tool
	}
	return cfg
}

// naiveStartup is the name of what a process of the naive dispatcher (or
// of the plain ledger dispatcher) allocates to start, in bench.startups.
func naiveStartup(ledger bool) string {
	if ledger {
		return "plain"
	}
	return "naive"
}

// naiveStarter starts the naive dispatcher on one tool's jobs (ledger:
// the plain ledger dispatcher): a process of its own (Config.NaiveCmd), or
// in this process.
func (b *bench) naiveStarter(tool string, ledger bool) starter {
	cfg := b.naiveConfig(tool, ledger)
	if b.cfg.InProcess || len(b.cfg.NaiveCmd) == 0 {
		return func(ctx context.Context) (*running, error) {
			ready := time.Now()
			n, err := startNaive(ctx, b.js, b.client, cfg, b.cfg.Logger)
			if err != nil {
				return nil, err
			}
			return &running{ready: ready, stop: func() (float64, float64, error) { n.stop(); return 0, 0, nil }}, nil
		}
	}
	return func(ctx context.Context) (*running, error) {
		p, err := b.startNaiveProc(ctx, cfg)
		if err != nil {
			return nil, err
		}
		procs := []*consumerProc{p}
		allocs := b.countAllocs(ctx, procs, naiveStartup(ledger))
		ready := time.Now()
		return &running{ready: ready, exited: exited(procs), stop: func() (float64, float64, error) {
			allocs()
			return stopProcs(procs)
		}}, nil
	}
}

// startToolqTraced starts a worker in this process on the Postgres ledger
// with the bench tools, taking the jobs of one tool, its spans going to tp
// (nil: the global provider, which records nothing here). It has the
// settings the consumer processes are given: the tools run Concurrency
// calls at once, and the worker holds four times as many deliveries, since
// most of them wait on the ledger's group commit, not on a tool.
func (b *bench) startToolqTraced(ctx context.Context, tool string, tp trace.TracerProvider) (func(), error) {
	slow := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		time.Sleep(b.cfg.SlowLatency)
		return json.RawMessage(`{"ok":true}`), nil
	})
	pay, err := tools.HTTPExecutor(tools.HTTP{Method: "POST", URL: b.url + "/v1/payments", Client: b.client})
	if err != nil {
		return nil, err
	}
	schema, forwards := json.RawMessage(`{"type":"object"}`), true
	reg, err := tools.NewRegistry([]tools.Definition{
		{Name: "pay", Class: tools.KeyedWrite, Schema: schema, Executor: pay, Downstream: pay.Downstream(), ForwardsKey: &forwards, Concurrency: b.cfg.Concurrency},
		{Name: "slow", Class: tools.KeyedWrite, Schema: schema, Executor: slow, Concurrency: b.cfg.Concurrency},
	}, tools.Config{Logger: b.quiet})
	if err != nil {
		return nil, err
	}
	// A ledger of its own, closed when the worker stops: a closed
	// connection reports its statistics to pg_stat_database at once.
	store, err := ledger.Open(ctx, b.cfg.DatabaseURL, "")
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := worker.New(wctx, worker.Config{JS: b.js, Ledger: store, Tools: reg, MaxInFlight: 4 * b.cfg.Concurrency,
		Consumer: worker.Consumer{Durable: "bench-toolq-" + tool, FilterSubject: jobs.JobSubject(tool), MaxAckPending: 4 * b.cfg.Concurrency},
		Logger:   b.quiet, TracerProvider: tp})
	if err != nil {
		cancel()
		store.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.Run(wctx); err != nil {
			b.cfg.Logger.Error("bench: the worker stopped", "error", err)
			b.results.fail(err)
		}
	}()
	return func() { cancel(); <-done; store.Close() }, nil
}

// latencies makes the latency runs at rate and at 100/s: at each, the
// naive dispatcher, then the consumer. In a comparison each build's run is
// made in two halves, in the order first, compared, compared, first, and
// each build's halves are counted as one run: so neither build always
// runs second, on a machine the other has just warmed (when the compared
// build always ran right after the first, the same build compared with
// itself had a p99 0.71–0.81 × the first's).
func (b *bench) latencies(ctx context.Context, r *Report, rate int, a, other build) error {
	var compared, compared100 *Latency // nil: no comparison
	if r.Compare != nil {
		compared, compared100 = &r.Compare.Lat, &r.Compare.Lat100
	}
	fixed := fmt.Sprintf("latency-%d", rate)
	if rate == 100 {
		fixed = "latency-fixed-100" // not the 100/s run's files
	}
	for _, at := range []struct {
		rate                   int
		naive, toolq, compared *Latency
		profile                string // its runs' profile files' name
	}{{rate, &r.NaiveLat, &r.ToolqLat, compared, fixed}, {100, &r.NaiveLat100, &r.ToolqLat100, compared100, "latency-100"}} {
		n := max(int(float64(at.rate)*b.cfg.LatencyFor.Seconds()), 1)
		type part struct {
			of   *build // nil: the naive dispatcher
			into *Latency
			n    int
		}
		parts := []part{{nil, at.naive, n}, {&a, at.toolq, n}}
		if at.compared != nil {
			half := max(n/2, 1)
			parts = []part{{nil, at.naive, n}, {&a, at.toolq, half}, {&other, at.compared, half}, {&other, at.compared, n - half}, {&a, at.toolq, n - half}}
		}
		samples := map[*Latency][]latencySample{}
		for _, p := range parts {
			b.profileName = at.profile
			if p.of == &other { // not by its path: a build compared with itself measures the noise
				b.profileName += "-compared"
			}
			if len(samples[p.into]) > 0 {
				b.profileName += "-2"
			}
			got, err := b.latencyRun(ctx, at.rate, p.of, nil, p.n)
			if err != nil {
				return fmt.Errorf("bench: latency at %d/s: %w", at.rate, err)
			}
			samples[p.into] = append(samples[p.into], got)
		}
		for into, runs := range samples {
			*into = latencyOf(at.rate, runs...)
		}
	}
	return nil
}

// latencyTraced publishes fresh jobs at rate for LatencyFor, to the naive
// dispatcher (of nil) or to toolq, its spans going to tp (set: a worker in
// this process), and returns the publish-to-result percentiles and when
// each job was sent, by tool_use_id.
func (b *bench) latencyTraced(ctx context.Context, rate int, of *build, tp trace.TracerProvider) (Latency, map[string]time.Time, error) {
	got, err := b.latencyRun(ctx, rate, of, tp, max(int(float64(rate)*b.cfg.LatencyFor.Seconds()), 1))
	if err != nil {
		return Latency{}, nil, err
	}
	return latencyOf(rate, got), got.sent, nil
}

// latencySample is what a latency run measured of its counted jobs.
type latencySample struct {
	lat      []float64            // each one's publish-to-result milliseconds
	sent     map[string]time.Time // when each was sent, by tool_use_id
	ledger   []StatementTime      // the ledger's statements (toolq's runs, on a Postgres server that times them)
	from, to machineTime          // the machine's time before the first was sent and after the last was answered
}

// latencyRun publishes n fresh jobs at rate, as latencyTraced does, and
// returns what it measured of them.
//
// A process that has just started is measured as one that has been
// running: WarmUp's jobs at the rate, uncounted, go first, so that it has
// opened its connections (the ledger's pool, with its statements
// prepared, the tool's) before the counted jobs; then the run waits for
// the machine to settle (the throughput run before it left Postgres
// writing out and vacuuming its rows), as a throughput run does.
func (b *bench) latencyRun(ctx context.Context, rate int, of *build, tp trace.TracerProvider, n int) (latencySample, error) {
	tool, start := "naive_pay", b.naiveStarter("naive_pay", false)
	if of != nil {
		tool, start = of.pay, b.toolqStarter(*of, of.pay, 1, tp)
	}
	r, err := start(ctx)
	if err != nil {
		return latencySample{}, err
	}
	defer r.stop()
	if b.cfg.WarmUp > 0 {
		if _, _, err := b.publishPaced(ctx, r, tool, rate, max(int(float64(rate)*b.cfg.WarmUp.Seconds()), 1)); err != nil {
			return latencySample{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	b.settle(ctx)
	timed := b.resetStatements(ctx)
	captured := b.captureCounted(ctx, r, countedWindow(n, rate))
	got := latencySample{from: readMachineTime()}
	if got.lat, got.sent, err = b.publishPaced(ctx, r, tool, rate, n); err != nil {
		return latencySample{}, err
	}
	got.to = readMachineTime()
	captured()
	if timed && of != nil {
		got.ledger = b.statements(ctx)
	}
	return got, nil
}

// countedWindow is how long the profiles of a latency run's counted jobs
// last: the n jobs' publishing at rate, and a second for their answers, in
// whole seconds (Go's CPU and delta profiles take no fraction).
func countedWindow(n, rate int) time.Duration {
	return time.Duration((n+rate-1)/rate+1) * time.Second
}

// isLatencyRun reports whether the profile files' name is a latency run's.
func isLatencyRun(profileName string) bool { return strings.HasPrefix(profileName, "latency-") }

// captureCounted, with ProfileDir, has r's consumer processes profile the
// window that begins now, for the counted jobs of a latency run: their CPU
// (.prof) and their execution trace (.trace) over the window, and what they
// allocated (.allocs, a delta) over the window and a second more, each from
// its --debug-pprof, each file made anew. A heap profile shows an
// allocation only after a forced collection (runtime.GC) or the second
// collection after it, so each process is made to collect its garbage
// before the window, and again once the counted jobs are answered and the
// CPU profile and trace are written (the returned function, called then):
// the delta holds what the counted jobs allocated and nothing of the
// warm-up's, and neither collection is in the CPU profile or the trace. It
// also holds the profiler's own allocations (runtime/pprof's and
// net/http/pprof's) and the process's until the delta ends. The
// returned function waits for the files, and says so in a warning if the
// counted jobs were answered after the CPU profile and trace had ended, or
// if the second collection came too late for the delta or failed. Without
// ProfileDir, or with no process of its own, it does nothing.
func (b *bench) captureCounted(ctx context.Context, r *running, window time.Duration) func() {
	if b.cfg.ProfileDir == "" || len(r.debug) == 0 {
		return func() {}
	}
	window = window.Truncate(time.Second) // the seconds asked for
	client := http.Client{Timeout: window + 30*time.Second}
	files := make([]string, len(r.debug))
	for i := range r.debug {
		files[i] = filepath.Join(b.cfg.ProfileDir, b.profileName)
		if len(r.debug) > 1 {
			files[i] += fmt.Sprintf("-%d", i+1)
		}
	}
	var prof, allocFiles []string
	for _, file := range files {
		prof, allocFiles = append(prof, file+".prof", file+".trace"), append(allocFiles, file+".allocs")
	}
	if err := b.collectGarbage(ctx, &client, r.debug); err != nil {
		b.cfg.Logger.Warn("bench: a latency run's allocation profile holds allocations from before its counted jobs", "files", allocFiles, "error", err)
	}
	asked := time.Now() // each window ends after asked and its seconds
	var profiles, allocs sync.WaitGroup
	for i, addr := range r.debug {
		file := files[i]
		for _, f := range []struct {
			path, ext string
			seconds   time.Duration
			wg        *sync.WaitGroup
		}{{"profile", ".prof", window, &profiles}, {"trace", ".trace", window, &profiles}, {"allocs", ".allocs", window + time.Second, &allocs}} {
			os.Remove(file + f.ext) // not an earlier bench's, if this one's fails
			f.wg.Go(func() {
				url := fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", addr, f.path, int(f.seconds/time.Second))
				if err := fetchTo(ctx, &client, url, file+f.ext); err != nil {
					b.cfg.Logger.Warn("bench: profile of a latency run's counted jobs", "file", file+f.ext, "error", err)
				}
			})
		}
	}
	time.Sleep(profileStart) // the processes have begun to profile before the first counted job
	return func() {
		if time.Since(asked) > window {
			b.cfg.Logger.Warn("bench: a latency run's CPU profile and trace ended before its counted jobs' last answer: they miss the last jobs",
				"files", prof, "window", window)
		}
		profiles.Wait()
		err := b.collectGarbage(ctx, &client, r.debug)
		if err == nil && time.Since(asked) > window+time.Second {
			err = errors.New("the collection may have come after the allocation delta's end")
		}
		if err != nil {
			b.cfg.Logger.Warn("bench: a latency run's allocation profile misses its counted jobs' allocations", "files", allocFiles, "error", err)
		}
		allocs.Wait()
	}
}

// profileStart is how long a process asked for a profile over loopback is
// given to begin it before the first counted job is sent.
const profileStart = 100 * time.Millisecond

// collectGarbage has each of the processes at addrs collect its garbage
// (--debug-pprof's heap?gc=1, in text: no gzip), and returns once all
// have, with their errors.
func (b *bench) collectGarbage(ctx context.Context, client *http.Client, addrs []string) error {
	var wg sync.WaitGroup
	errs := make([]error, len(addrs))
	for i, addr := range addrs {
		wg.Go(func() {
			errs[i] = fetchTo(ctx, client, "http://"+addr+"/debug/pprof/heap?gc=1&debug=1", "")
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// fetchTo writes what GET url answers into file (none: "").
func fetchTo(ctx context.Context, client *http.Client, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	if err != nil || file == "" {
		return err
	}
	return os.WriteFile(file, body, 0o644)
}

// publishPaced publishes n fresh jobs for tool at rate to r, and returns each
// one's publish-to-result milliseconds and when each was sent.
func (b *bench) publishPaced(ctx context.Context, r *running, tool string, rate, n int) ([]float64, map[string]time.Time, error) {
	batch := b.jobsFor(tool, 1000+int(b.seq.Load()), n, false)
	want := make(map[string]bool, n)
	for _, j := range batch {
		want[j.ToolUseID] = true
	}
	done := b.results.expect(want)
	client := jobs.NewClient(b.js)
	sent := make(map[string]time.Time, n)
	var mu sync.Mutex
	pace := paced(rate)
	for i, j := range batch {
		pace(i)
		mu.Lock()
		sent[j.ToolUseID] = time.Now()
		mu.Unlock()
		go client.Publish(ctx, j)
	}
	select {
	case <-done:
	case <-r.exited:
		return nil, nil, errors.New("what took the jobs stopped on its own")
	case <-b.results.failed:
		return nil, nil, b.results.err
	case <-time.After(2 * time.Minute):
		return nil, nil, fmt.Errorf("%d results missing", b.results.missing())
	}
	mu.Lock()
	defer mu.Unlock()
	lat := make([]float64, 0, n)
	for id, at := range b.results.arrivals(want) {
		lat = append(lat, at.Sub(sent[id]).Seconds()*1000)
	}
	return lat, sent, nil
}

// latencyOf is the figures of one latency run, made of runs (one, or a
// comparison's two halves; at least one job in all): the percentiles of
// all their jobs, their ledger statements counted as one run's, and the
// share of their time the hypervisor took (of the runs whose machine time
// was read before and after: 0 when none was).
func latencyOf(rate int, runs ...latencySample) Latency {
	var lat []float64
	var ledgers [][]StatementTime
	var spent machineTime // the machine's time over the runs, their gaps left out
	for _, r := range runs {
		lat = append(lat, r.lat...)
		if r.ledger != nil {
			ledgers = append(ledgers, r.ledger)
		}
		t := r.to.since(r.from)
		spent.steal += t.steal
		spent.all += t.all
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return lat[min(int(p*float64(len(lat))), len(lat)-1)] }
	return Latency{Rate: rate, Jobs: len(lat), P50ms: pct(0.50), P90ms: pct(0.90), P99ms: pct(0.99), MaxMs: lat[len(lat)-1],
		Ledger: mergeStatements(ledgers), StealPct: spent.stealPct()}
}

// mergeStatements counts the statements of several runs as one run's.
func mergeStatements(runs [][]StatementTime) []StatementTime {
	if len(runs) == 1 {
		return runs[0]
	}
	var out []StatementTime
	for _, run := range runs {
		for _, st := range run {
			i := slices.IndexFunc(out, func(o StatementTime) bool { return o.Kind == st.Kind })
			if i < 0 {
				out = append(out, st)
				continue
			}
			o := &out[i]
			if calls := o.Calls + st.Calls; calls > 0 {
				o.MeanMs = (o.MeanMs*float64(o.Calls) + st.MeanMs*float64(st.Calls)) / float64(calls)
				o.Calls = calls
			}
			o.MaxMs = max(o.MaxMs, st.MaxMs)
		}
	}
	return out
}

// StatementTime is one kind of ledger statement as the Postgres server
// timed it (pg_stat_statements: execution only; a commit's WAL flush
// comes after).
type StatementTime struct {
	Kind   string  `json:"kind"`
	Calls  int64   `json:"calls"`
	MeanMs float64 `json:"mean_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// resetStatements clears pg_stat_statements, and reports whether the
// server has it.
func (b *bench) resetStatements(ctx context.Context) bool {
	if _, err := b.pg.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return false
	}
	_, err := b.pg.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	return err == nil
}

// statements is what pg_stat_statements timed since resetStatements, by
// kind of ledger statement.
func (b *bench) statements(ctx context.Context) []StatementTime {
	rows, err := b.pg.Query(ctx, `SELECT query, calls, mean_exec_time, max_exec_time FROM pg_stat_statements WHERE query LIKE '%toolq_ledger%'`)
	if err != nil {
		return nil
	}
	defer rows.Close()
	by := map[string]*StatementTime{}
	var order []string
	for rows.Next() {
		var q string
		var calls int64
		var mean, maxMs float64
		if rows.Scan(&q, &calls, &mean, &maxMs) != nil {
			return nil
		}
		kind := statementKind(q)
		st := by[kind]
		if st == nil {
			st = &StatementTime{Kind: kind}
			by[kind] = st
			order = append(order, kind)
		}
		st.MeanMs = (st.MeanMs*float64(st.Calls) + mean*float64(calls)) / float64(st.Calls+calls)
		st.Calls += calls
		st.MaxMs = max(st.MaxMs, maxMs)
	}
	slices.Sort(order)
	out := make([]StatementTime, 0, len(order))
	for _, k := range order {
		out = append(out, *by[k])
	}
	return out
}

// statementKind names a ledger statement by what it does.
func statementKind(q string) string {
	switch {
	case strings.Contains(q, "WITH input AS"):
		return "claim"
	case strings.Contains(q, "UPDATE toolq_ledger AS t SET state"):
		return "complete"
	case strings.Contains(q, "key = ANY"):
		return "read settled"
	default:
		return "other"
	}
}

// commits is the ledger database's committed transactions so far.
func (b *bench) commits(ctx context.Context) int64 {
	var n int64
	b.pg.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n
}

// walFlushes is how many times the ledger's server has flushed its WAL to
// disk (the whole server: the bench's Postgres has no other database).
func (b *bench) walFlushes(ctx context.Context) int64 {
	var n int64
	b.pg.QueryRow(ctx, `SELECT wal_sync FROM pg_stat_wal`).Scan(&n)
	return n
}

// resultWatch records when each result arrives, by tool_use_id, from a
// plain subscription to every result.
type resultWatch struct {
	sub  *nats.Subscription
	mu   sync.Mutex
	at   map[string]time.Time
	want map[string]bool
	left int
	done chan struct{}

	failOnce sync.Once
	failed   chan struct{} // closed when a consumer under test stopped on its own
	err      error
}

func watchResults(nc *nats.Conn) (*resultWatch, error) {
	w := &resultWatch{at: map[string]time.Time{}, failed: make(chan struct{})}
	sub, err := nc.Subscribe(jobs.ResultsPrefix+">", func(m *nats.Msg) {
		now := time.Now()
		var r struct {
			ToolUseID string `json:"tool_use_id"`
		}
		if json.Unmarshal(m.Data, &r) != nil {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, seen := w.at[r.ToolUseID]; seen {
			return
		}
		w.at[r.ToolUseID] = now
		if w.want[r.ToolUseID] {
			w.left--
			if w.left == 0 {
				close(w.done)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	sub.SetPendingLimits(-1, -1)
	w.sub = sub
	return w, nil
}

// expect returns a channel closed once every id in want has a result.
func (w *resultWatch) expect(want map[string]bool) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.want, w.left, w.done = want, 0, make(chan struct{})
	for id := range want {
		if _, seen := w.at[id]; !seen {
			w.left++
		}
	}
	if w.left == 0 {
		close(w.done)
	}
	return w.done
}

func (w *resultWatch) missing() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.left
}

func (w *resultWatch) arrivals(ids map[string]bool) map[string]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]time.Time, len(ids))
	for id := range ids {
		out[id] = w.at[id]
	}
	return out
}

func (w *resultWatch) stop() { w.sub.Unsubscribe() }

// fail ends every wait for results: a consumer under test stopped.
func (w *resultWatch) fail(err error) {
	w.failOnce.Do(func() { w.err = err; close(w.failed) })
}

// levelFilter passes warnings and errors only.
type levelFilter struct{ slog.Handler }

func (f levelFilter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

// watchStalls logs a warning whenever this process went more than a second
// without running a 50 ms ticker.
func watchStalls(log *slog.Logger) func() {
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				if gap := now.Sub(last); gap > time.Second {
					log.Warn("bench: this process did not run for a while: the machine stalled; figures of this run are slower for it", "gap", gap.Round(time.Millisecond))
				}
				last = now
			}
		}
	}()
	return func() { close(stop) }
}

// Phase is one step of a delivery, its duration over the jobs of a run,
// and its mean over the run's slowest jobs (the 1 % slowest from publish
// to result): where a tail comes from.
type Phase struct {
	Name   string  `json:"name"`
	P50ms  float64 `json:"p50_ms"`
	P99ms  float64 `json:"p99_ms"`
	SlowMs float64 `json:"slowest_1pct_mean_ms"`
}

// The phases of a delivery, in order.
const (
	phaseToProcessing = "publish to processing"
	phaseClaim        = "claim (ledger)"
	phaseTool         = "tool call"
	phaseSettle       = "record the outcome (ledger)"
	phasePublish      = "publish the result"
	phaseProcessing   = "processing (decode to ack)"
	phaseToAgent      = "result: publish call to received"
	phaseEndToEnd     = "publish to result (end to end)"
)

// phases runs toolq at rate with its spans recorded and returns, per step
// of a delivery, the median and p99 of its duration and its mean over the
// slowest 1 % of the jobs: from publish to the start of processing
// (JetStream's delivery, the pull, a wait for a slot), the claim, the tool
// call, recording the outcome, publishing the result (to its PubAck), the
// whole processing span (which ends after the ack), from the result's
// publication to its arrival at the agent, and the whole.
func (b *bench) phases(ctx context.Context, rate int) ([]Phase, error) {
	rec := &phaseRecorder{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.WithoutCancel(ctx))
	_, sent, err := b.latencyTraced(ctx, rate, &build{pay: "pay"}, tp)
	if err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond) // the last spans end after their result
	spans := rec.ended()
	want := make(map[string]bool, len(sent))
	for id := range sent {
		want[id] = true
	}
	arrived := b.results.arrivals(want)
	jobOf := map[trace.SpanID]string{} // process span → tool_use_id
	for _, s := range spans {
		if s.phase == phaseProcessing {
			jobOf[s.id] = s.toolUseID
		}
	}
	per := map[string]map[string]float64{} // tool_use_id → phase → ms
	note := func(job, phase string, d time.Duration) {
		if per[job] == nil {
			per[job] = map[string]float64{}
		}
		per[job][phase] += d.Seconds() * 1000
	}
	for _, s := range spans {
		job := s.toolUseID
		if s.phase != phaseProcessing {
			job = jobOf[s.parent]
		}
		at, ok := sent[job]
		if !ok {
			continue
		}
		note(job, s.phase, s.end.Sub(s.start))
		switch s.phase {
		case phaseProcessing:
			note(job, phaseToProcessing, s.start.Sub(at))
			note(job, phaseEndToEnd, arrived[job].Sub(at))
		case phasePublish: // the agent may have it before the PubAck is back
			note(job, phaseToAgent, arrived[job].Sub(s.start))
		}
	}
	var ids []string
	for id, ph := range per {
		if _, ok := ph[phaseEndToEnd]; ok {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(x, y string) int { return cmp.Compare(per[x][phaseEndToEnd], per[y][phaseEndToEnd]) })
	slowest := ids[len(ids)-max(len(ids)/100, 1):]
	var out []Phase
	for _, name := range []string{phaseToProcessing, phaseClaim, phaseTool, phaseSettle, phasePublish, phaseProcessing, phaseToAgent, phaseEndToEnd} {
		var d []float64
		for _, id := range ids {
			if v, ok := per[id][name]; ok {
				d = append(d, v)
			}
		}
		if len(d) == 0 {
			continue
		}
		var slow float64
		for _, id := range slowest {
			slow += per[id][name]
		}
		slices.Sort(d)
		out = append(out, Phase{Name: name, P50ms: d[len(d)/2], P99ms: d[min(len(d)*99/100, len(d)-1)], SlowMs: slow / float64(len(slowest))})
	}
	return out, nil
}

// phaseRecorder keeps, of each ended span of a phase, its phase, times,
// ids and tool_use_id only: a recorder that kept whole spans (tracetest's)
// grows by thousands of spans a second at the fixed rate, and the
// collector's work showed up in the phases' tails it was measuring.
type phaseRecorder struct {
	mu    sync.Mutex
	spans []phaseSpan
}

type phaseSpan struct {
	phase, toolUseID string
	id, parent       trace.SpanID
	start, end       time.Time
}

func (r *phaseRecorder) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (r *phaseRecorder) Shutdown(context.Context) error                  { return nil }
func (r *phaseRecorder) ForceFlush(context.Context) error                { return nil }

func (r *phaseRecorder) OnEnd(s sdktrace.ReadOnlySpan) {
	ps := phaseSpan{start: s.StartTime(), end: s.EndTime(), id: s.SpanContext().SpanID(), parent: s.Parent().SpanID()}
	switch name := s.Name(); {
	case strings.HasPrefix(name, "process "):
		ps.phase = phaseProcessing
		for _, kv := range s.Attributes() {
			if kv.Key == "toolq.tool_use_id" {
				ps.toolUseID = kv.Value.AsString()
			}
		}
	case strings.HasPrefix(name, "execute_tool "):
		ps.phase = phaseTool
	case name == "toolq.claim":
		ps.phase = phaseClaim
	case name == "toolq.settle":
		ps.phase = phaseSettle
	case strings.HasPrefix(name, "publish "):
		ps.phase = phasePublish
	default:
		return
	}
	r.mu.Lock()
	r.spans = append(r.spans, ps)
	r.mu.Unlock()
}

func (r *phaseRecorder) ended() []phaseSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans)
}

// paced returns a wait for the i-th job of a run at rate jobs/s, on a
// schedule from its first call: a generator that fell behind (this process
// not scheduled for a while) catches up instead of dropping the jobs it
// owed, as a ticker would, so that the run has its rate and its length.
func paced(rate int) func(i int) {
	var t0 time.Time
	return func(i int) {
		if t0.IsZero() {
			t0 = time.Now()
		}
		if d := time.Until(t0.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
			time.Sleep(d)
		}
	}
}
