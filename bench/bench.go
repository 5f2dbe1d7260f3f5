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
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/pull"
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
	Concurrency int    // jobs in flight, for toolq and the naive dispatcher alike (default 64)
	SlowLatency time.Duration
	// Rate is the fixed rate of the latency runs, jobs/s (0: half of
	// toolq's fresh throughput).
	Rate       int
	LatencyFor time.Duration // how long each latency run publishes (default 10s)
	// ConsumerBin is the consumer binary the scaling and memory runs start
	// as separate processes (empty: those runs are not made).
	ConsumerBin string
	Processes   []int         // consumer process counts of the scaling runs (default 1, 2, 4)
	MemoryFor   time.Duration // how long the memory run lasts at the fixed rate (0: no memory run)
	Logger      *slog.Logger  // progress lines (nil: none)
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
	if c.LatencyFor <= 0 {
		c.LatencyFor = 10 * time.Second
	}
	if c.Processes == nil {
		c.Processes = []int{1, 2, 4}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Throughput is one scenario's figures, the median of its runs.
type Throughput struct {
	JobsPerS      float64   `json:"jobs_per_s"`
	CPUPer1000    float64   `json:"cpu_s_per_1000"`             // CPU seconds of this process (consumer, driver, sandbox) per 1,000 jobs
	MachineCPU    float64   `json:"machine_cpu_s_per_1000"`     // CPU seconds of the whole machine (with nats-server and Postgres) per 1,000 jobs
	CommitsPerJob float64   `json:"ledger_commits_per_job"`     // Postgres transactions per job (pg_stat_database)
	FlushesPerJob float64   `json:"ledger_wal_flushes_per_job"` // WAL flushes to disk per job (pg_stat_wal)
	PeakRSSMiB    float64   `json:"peak_rss_mib"`
	Payments      int       `json:"payments"` // payments the sandbox made in the run reported (a duplicate makes none)
	Runs          []float64 `json:"runs_jobs_per_s"`
}

// Latency is the publish-to-result latency at a fixed rate.
type Latency struct {
	Rate     int     `json:"rate"`
	Jobs     int     `json:"jobs"`
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
	Phases []Phase `json:"toolq_latency_phases,omitempty"`
	// Processes are the scaling runs (consumer processes on one durable),
	// Memory the long run at the fixed rate; both need Config.ConsumerBin.
	Processes []Processes `json:"processes,omitempty"`
	Memory    *Memory     `json:"memory,omitempty"`
}

// bench is one run's shared parts.
type bench struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	store   *ledger.Store
	pg      *pgx.Conn
	sandbox *sandbox.Server
	url     string // the sandbox's base URL
	client  *http.Client
	results *resultWatch
	seq     atomic.Int64
	quiet   *slog.Logger // the worker's: warnings and errors only

	toolsFile           string  // the consumer processes' registry
	childCPU, childPeak float64 // the last run's consumer processes: CPU seconds, peak RSS MiB
}

// Run measures every scenario once (throughput ones Reps times) and
// returns the figures.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.fill()
	b := &bench{cfg: cfg, quiet: slog.New(levelFilter{cfg.Logger.Handler()})}
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
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = cfg.Concurrency
	b.client = &http.Client{Transport: transport}
	if err := jobs.ProvisionStreams(ctx, b.js, jobs.Streams{}); err != nil {
		return nil, err
	}
	if b.results, err = watchResults(b.nc); err != nil {
		return nil, err
	}
	defer b.results.stop()

	// A machine that stops running this process for a while (a shared VM
	// descheduled, paused or snapshotted) makes a run slow for reasons of
	// its own: say so, so that such a run is not read as toolq's figure.
	stopWatch := watchStalls(cfg.Logger)
	defer stopWatch()
	r := &Report{Jobs: cfg.Jobs, Concurrency: cfg.Concurrency}
	for _, s := range []struct {
		name string
		into *Throughput
		run  func(ctx context.Context, rep int) (time.Duration, error)
	}{
		{"naive", &r.Naive, b.naiveRun},
		{"fresh", &r.Fresh, b.freshRun},
		{"duplicate", &r.Duplicate, b.duplicateRun},
		{"slow", &r.Slow, b.slowRun},
	} {
		if err := b.measure(ctx, s.name, s.into, s.run); err != nil {
			return nil, fmt.Errorf("bench: %s: %w", s.name, err)
		}
	}
	r.SlowBound = float64(cfg.Concurrency) / cfg.SlowLatency.Seconds()
	rate := cfg.Rate
	if rate <= 0 {
		rate = max(int(r.Fresh.JobsPerS/2), 1)
	}
	for _, l := range []struct {
		into  *Latency
		rate  int
		toolq bool
	}{{&r.NaiveLat, rate, false}, {&r.ToolqLat, rate, true}, {&r.NaiveLat100, 100, false}, {&r.ToolqLat100, 100, true}} {
		lat, err := b.latency(ctx, l.rate, l.toolq)
		if err != nil {
			return nil, fmt.Errorf("bench: latency at %d/s: %w", l.rate, err)
		}
		*l.into = lat
	}
	if r.Phases, err = b.phases(ctx, rate); err != nil {
		return nil, fmt.Errorf("bench: latency phases at %d/s: %w", rate, err)
	}
	if cfg.ConsumerBin == "" {
		return r, nil
	}
	dir, err := os.MkdirTemp("", "toolq-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if b.toolsFile, err = b.writeScaleTools(dir); err != nil {
		return nil, err
	}
	for _, n := range cfg.Processes {
		p := Processes{N: n}
		if err := b.measureCounted(ctx, fmt.Sprintf("processes-%d", n), &p.Throughput, b.processesRun(n)); err != nil {
			return nil, fmt.Errorf("bench: %d consumer processes: %w", n, err)
		}
		r.Processes = append(r.Processes, p)
	}
	if cfg.MemoryFor > 0 {
		b.cfg.Logger.Info("bench memory run", "rate", rate, "for", cfg.MemoryFor)
		m, err := b.memory(ctx, rate, cfg.MemoryFor)
		if err != nil {
			return nil, fmt.Errorf("bench: memory run: %w", err)
		}
		r.Memory = &m
	}
	return r, nil
}

// measure runs one throughput scenario Reps times and keeps the median.
func (b *bench) measure(ctx context.Context, name string, into *Throughput, run func(context.Context, int) (time.Duration, error)) error {
	return b.measureCounted(ctx, name, into, func(ctx context.Context, rep int) (time.Duration, int, error) {
		d, err := run(ctx, rep)
		return d, 0, err
	})
}

// measureCounted is measure for a run that says how many jobs its elapsed
// time covers (0: all of them); the per-job figures are over all the jobs.
func (b *bench) measureCounted(ctx context.Context, name string, into *Throughput, run func(context.Context, int) (time.Duration, int, error)) error {
	type sample struct {
		perS, cpu, machine, commits, flushes, peak float64
		payments                                   int
	}
	var samples []sample
	n := b.cfg.Jobs
	if name == "slow" {
		n = min(n, b.cfg.Concurrency*40)
	}
	for rep := range b.cfg.Reps {
		cpu0, machine0, commits0, flushes0, payments0 := cpuSeconds(), machineCPUSeconds(), b.commits(ctx), b.walFlushes(ctx), len(b.sandbox.Payments())
		var elapsed time.Duration
		var counted int
		var err error
		b.childCPU, b.childPeak = 0, 0
		// The scenario labels its samples in a CPU profile (go tool pprof
		// -tagfocus scenario=duplicate).
		pprof.Do(ctx, pprof.Labels("scenario", name), func(ctx context.Context) { elapsed, counted, err = run(ctx, rep) })
		if err != nil {
			return err
		}
		if counted == 0 {
			counted = n
		}
		time.Sleep(300 * time.Millisecond) // the closed connections' statistics reach pg_stat_database
		per := func(d float64) float64 { return d / float64(n) }
		s := sample{perS: float64(counted) / elapsed.Seconds(), cpu: per(cpuSeconds()-cpu0+b.childCPU) * 1000, machine: per(machineCPUSeconds()-machine0) * 1000,
			commits: per(float64(b.commits(ctx) - commits0)), flushes: per(float64(b.walFlushes(ctx) - flushes0)),
			payments: len(b.sandbox.Payments()) - payments0, peak: b.childPeak}
		samples = append(samples, s)
		into.Runs = append(into.Runs, s.perS)
		b.cfg.Logger.Info("bench run", "scenario", name, "rep", rep+1, "jobs_per_s", int(s.perS), "cpu_s_per_1000", fmt.Sprintf("%.3f", s.cpu))
	}
	slices.SortFunc(samples, func(a, b sample) int { return cmp.Compare(a.perS, b.perS) })
	m := samples[len(samples)/2]
	into.JobsPerS, into.CPUPer1000, into.MachineCPU, into.CommitsPerJob, into.FlushesPerJob, into.PeakRSSMiB = m.perS, m.cpu, m.machine, m.commits, m.flushes, cmp.Or(m.peak, peakRSSMiB())
	into.Payments = m.payments
	return nil
}

// The scenarios. Each publishes its jobs first (a backlog), then starts
// its consumer and times until every job has its result.

func (b *bench) naiveRun(ctx context.Context, rep int) (time.Duration, error) {
	batch := b.jobsFor("naive_pay", rep, b.cfg.Jobs, false)
	if err := b.publishAll(ctx, batch); err != nil {
		return 0, err
	}
	return b.timed(ctx, batch, func(ctx context.Context) (func(), error) { return b.startNaive(ctx, "naive_pay") })
}

func (b *bench) freshRun(ctx context.Context, rep int) (time.Duration, error) {
	batch := b.jobsFor("pay", rep, b.cfg.Jobs, false)
	if err := b.publishAll(ctx, batch); err != nil {
		return 0, err
	}
	return b.timed(ctx, batch, func(ctx context.Context) (func(), error) { return b.startToolq(ctx, "pay") })
}

func (b *bench) duplicateRun(ctx context.Context, rep int) (time.Duration, error) {
	// The fresh run of the same rep completed these calls: a retried turn
	// sends each again with a new tool_use_id.
	batch := b.jobsFor("pay", rep, b.cfg.Jobs, true)
	if err := b.publishAll(ctx, batch); err != nil {
		return 0, err
	}
	return b.timed(ctx, batch, func(ctx context.Context) (func(), error) { return b.startToolq(ctx, "pay") })
}

func (b *bench) slowRun(ctx context.Context, rep int) (time.Duration, error) {
	batch := b.jobsFor("slow", rep, min(b.cfg.Jobs, b.cfg.Concurrency*40), false)
	if err := b.publishAll(ctx, batch); err != nil {
		return 0, err
	}
	return b.timed(ctx, batch, func(ctx context.Context) (func(), error) { return b.startToolq(ctx, "slow") })
}

// jobsFor makes n jobs for tool: the calls of run rep, with tool_use_ids
// new to this batch (retry: the same calls as an earlier batch).
func (b *bench) jobsFor(tool string, rep, n int, _ bool) []*jobs.Job {
	out := make([]*jobs.Job, n)
	batch := b.seq.Add(1)
	for i := range out {
		args := fmt.Sprintf(`{"invoice_id":"inv-%s-%d-%d","amount_cents":100,"currency":"EUR"}`, tool, rep, i)
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

// timed starts a consumer and returns how long it took to answer every job
// of the batch.
func (b *bench) timed(ctx context.Context, batch []*jobs.Job, start func(context.Context) (func(), error)) (time.Duration, error) {
	want := make(map[string]bool, len(batch))
	for _, j := range batch {
		want[j.ToolUseID] = true
	}
	done := b.results.expect(want)
	t0 := time.Now()
	stop, err := start(ctx)
	if err != nil {
		return 0, err
	}
	defer stop()
	select {
	case <-done:
		return time.Since(t0), nil
	case <-b.results.failed:
		return 0, b.results.err
	case <-time.After(10 * time.Minute):
		return 0, fmt.Errorf("%d of %d results after 10 minutes", len(batch)-b.results.missing(), len(batch))
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// startToolq starts a worker on the Postgres ledger with the bench tools,
// taking the jobs of one tool. The tools run Concurrency calls at once, as
// the naive dispatcher does; the worker holds four times as many
// deliveries, since most of them wait on the ledger's group commit, not on
// a tool.
func (b *bench) startToolq(ctx context.Context, tool string) (func(), error) {
	return b.startToolqTraced(ctx, tool, nil)
}

// startToolqTraced is startToolq with the worker's spans going to tp (nil:
// the global provider, which records nothing here).
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

// startNaive starts the dispatcher with no memory on toolq.jobs.<tool>: pull,
// POST the sandbox, publish the result, wait for its PubAck, ack.
func (b *bench) startNaive(ctx context.Context, tool string) (func(), error) {
	cons, err := b.js.CreateOrUpdateConsumer(ctx, jobs.JobsStream, jetstream.ConsumerConfig{Durable: "bench-naive",
		FilterSubject: jobs.JobSubject(tool), AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 4 * b.cfg.Concurrency})
	if err != nil {
		return nil, err
	}
	iter, err := cons.Messages(jetstream.PullMaxMessages(32), jetstream.PullExpiry(5*time.Second)) // as toolq pulls
	if err != nil {
		return nil, err
	}
	it := pull.New(iter, b.nc)
	sem := make(chan struct{}, b.cfg.Concurrency)
	var wg sync.WaitGroup
	go func() {
		for {
			msg, err := it.Next()
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return // stopped
			}
			if err != nil { // a missed heartbeat, say: the pull goes on
				b.cfg.Logger.Warn("naive dispatcher: pull", "error", err)
				continue
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				b.naiveOne(ctx, msg)
			}()
		}
	}()
	return func() { it.Stop(); wg.Wait() }, nil
}

func (b *bench) naiveOne(ctx context.Context, msg jetstream.Msg) {
	j, err := jobs.DecodeJob(msg.Data())
	if err != nil {
		msg.Term()
		return
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", b.url+"/v1/payments", bytesReader(j.Args))
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	if err != nil {
		msg.Nak()
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r := jobs.NewResult(j, "", jobs.StatusOK)
	r.Output = body
	out, _ := json.Marshal(r)
	if _, err := b.js.Publish(ctx, jobs.ResultSubject(j.ConversationID), out); err != nil {
		msg.Nak()
		return
	}
	msg.Ack()
}

// latency publishes fresh jobs at rate for LatencyFor and returns the
// publish-to-result percentiles.
func (b *bench) latency(ctx context.Context, rate int, toolq bool) (Latency, error) {
	lat, _, err := b.latencyTraced(ctx, rate, toolq, nil)
	return lat, err
}

// latencyTraced is latency, toolq's spans going to tp; it also returns when
// each job was sent, by tool_use_id.
func (b *bench) latencyTraced(ctx context.Context, rate int, toolq bool, tp trace.TracerProvider) (Latency, map[string]time.Time, error) {
	tool, start := "naive_pay", func(ctx context.Context) (func(), error) { return b.startNaive(ctx, "naive_pay") }
	if toolq {
		tool, start = "pay", func(ctx context.Context) (func(), error) { return b.startToolqTraced(ctx, "pay", tp) }
	}
	stop, err := start(ctx)
	if err != nil {
		return Latency{}, nil, err
	}
	defer stop()
	n := max(int(float64(rate)*b.cfg.LatencyFor.Seconds()), 1)
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
	case <-b.results.failed:
		return Latency{}, nil, b.results.err
	case <-time.After(2 * time.Minute):
		return Latency{}, nil, fmt.Errorf("%d results missing", b.results.missing())
	}
	lat := make([]float64, 0, n)
	for id, at := range b.results.arrivals(want) {
		lat = append(lat, at.Sub(sent[id]).Seconds()*1000)
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return lat[min(int(p*float64(len(lat))), len(lat)-1)] }
	mu.Lock()
	defer mu.Unlock()
	return Latency{Rate: rate, Jobs: n, P50ms: pct(0.50), P90ms: pct(0.90), P99ms: pct(0.99), MaxMs: lat[len(lat)-1]}, sent, nil
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

// machineCPUSeconds is the CPU time every process of the machine has used
// (user, nice, system, irq, softirq from /proc/stat), 0 where there is no
// /proc.
func machineCPUSeconds() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var ticks int64
	for i := 1; i < len(f) && i <= 7; i++ {
		if i == 4 || i == 5 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += n
	}
	return float64(ticks) / 100 // USER_HZ
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func peakRSSMiB() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Maxrss) / 1024 // KiB on Linux
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

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

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

// Phase is one step of a delivery, its duration over the jobs of a run.
type Phase struct {
	Name  string  `json:"name"`
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"`
}

// phases runs toolq at rate with its spans recorded and returns, per step
// of a delivery, the median and p99 of its duration: from publish to the
// start of processing (JetStream's delivery, the pull, a wait for a slot),
// the claim, the tool call, recording the outcome, publishing the result,
// and the whole processing span (which ends after the ack).
func (b *bench) phases(ctx context.Context, rate int) ([]Phase, error) {
	rec := &phaseRecorder{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.WithoutCancel(ctx))
	_, sent, err := b.latencyTraced(ctx, rate, true, tp)
	if err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond) // the last spans end after their result
	by := map[string][]float64{}
	for _, s := range rec.ended() {
		by[s.phase] = append(by[s.phase], s.end.Sub(s.start).Seconds()*1000)
		if at, ok := sent[s.toolUseID]; ok && s.toolUseID != "" {
			by["publish to processing"] = append(by["publish to processing"], s.start.Sub(at).Seconds()*1000)
		}
	}
	var out []Phase
	for _, name := range []string{"publish to processing", "claim (ledger)", "tool call", "record the outcome (ledger)", "publish the result", "processing (decode to ack)"} {
		d := by[name]
		if len(d) == 0 {
			continue
		}
		slices.Sort(d)
		out = append(out, Phase{Name: name, P50ms: d[len(d)/2], P99ms: d[min(len(d)*99/100, len(d)-1)]})
	}
	return out, nil
}

// phaseRecorder keeps, of each ended span of a phase, its phase, times and
// tool_use_id only: a recorder that kept whole spans (tracetest's) grows by
// thousands of spans a second at the fixed rate, and the collector's work
// showed up in the phases' tails it was measuring.
type phaseRecorder struct {
	mu    sync.Mutex
	spans []phaseSpan
}

type phaseSpan struct {
	phase, toolUseID string
	start, end       time.Time
}

func (r *phaseRecorder) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (r *phaseRecorder) Shutdown(context.Context) error                  { return nil }
func (r *phaseRecorder) ForceFlush(context.Context) error                { return nil }

func (r *phaseRecorder) OnEnd(s sdktrace.ReadOnlySpan) {
	ps := phaseSpan{start: s.StartTime(), end: s.EndTime()}
	switch name := s.Name(); {
	case strings.HasPrefix(name, "process "):
		ps.phase = "processing (decode to ack)"
		for _, kv := range s.Attributes() {
			if kv.Key == "toolq.tool_use_id" {
				ps.toolUseID = kv.Value.AsString()
			}
		}
	case strings.HasPrefix(name, "execute_tool "):
		ps.phase = "tool call"
	case name == "toolq.claim":
		ps.phase = "claim (ledger)"
	case name == "toolq.settle":
		ps.phase = "record the outcome (ledger)"
	case strings.HasPrefix(name, "publish "):
		ps.phase = "publish the result"
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
