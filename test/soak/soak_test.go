package soak

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Sizes: the short run is part of go test ./...; -soak.full is `make soak`.
// Each can be changed by flag or by environment variable.
var (
	flagFull   = flag.Bool("soak.full", os.Getenv("TOOLQ_SOAK_FULL") != "", "the full soak: 10,000 jobs, 50 faults of each kind (env TOOLQ_SOAK_FULL)")
	flagSeed   = flag.Uint64("soak.seed", envUint("TOOLQ_SOAK_SEED", 1), "seed of the plan and the fault schedule (env TOOLQ_SOAK_SEED)")
	flagJobs   = flag.Int("soak.jobs", int(envUint("TOOLQ_SOAK_JOBS", 0)), "calls to publish, before duplicates (env TOOLQ_SOAK_JOBS; 0: 300, full 10000)")
	flagFaults = flag.Int("soak.faults", int(envUint("TOOLQ_SOAK_FAULTS", 0)), "faults of each kind (env TOOLQ_SOAK_FAULTS; 0: 2, full 50)")
	flagWindow = flag.Duration("soak.window", 0, "how long the load and the faults last (0: 25s, full 15m)")
	flagKeep   = flag.Bool("soak.keep", false, "keep the run's directory (logs, stores, report) even when it passes")
	flagExec   = flag.String("soak.executor", os.Getenv("TOOLQ_SOAK_EXECUTOR"), "how the consumers reach the sandbox, one soak each: http (its HTTP API), mcp (its MCP server over Streamable HTTP), or both, comma-separated (env TOOLQ_SOAK_EXECUTOR; empty: http,mcp, full http)")
)

// executors are the soaks to run, one per executor (see flagExec).
func executors() []string {
	switch {
	case *flagExec != "":
		return strings.Split(*flagExec, ",")
	case *flagFull:
		return []string{"http"}
	}
	return []string{"http", "mcp"}
}

func envUint(name string, def uint64) uint64 {
	if v, err := strconv.ParseUint(os.Getenv(name), 10, 64); err == nil {
		return v
	}
	return def
}

// The consumers' timing: a zombie is stopped longer than both.
const (
	ackWait   = 3 * time.Second
	toolLease = 2 * time.Second // registryYAML
	consumers = 3
	// Every write at the sandbox takes this long, so that faults find calls
	// in flight.
	sandboxLatency = 30 * time.Millisecond
)

type size struct {
	jobs, faults   int
	window, settle time.Duration
}

func sizeOf() size {
	s := size{jobs: 300, faults: 2, window: 25 * time.Second, settle: 60 * time.Second}
	if *flagFull {
		s = size{jobs: 10000, faults: 50, window: 15 * time.Minute, settle: 10 * time.Minute}
	}
	if *flagJobs > 0 {
		s.jobs = *flagJobs
	}
	if *flagFaults > 0 {
		s.faults = *flagFaults
	}
	if *flagWindow > 0 {
		s.window = *flagWindow
	}
	return s
}

// run is one soak: the processes, the proxies and what the driver did.
type run struct {
	t        *testing.T
	executor string // http or mcp: how the consumers reach the sandbox
	dir      string
	cluster  *testenv.Cluster
	dbURL    string
	nats     *natsProc
	sbURL    string // direct, for the driver and the checker
	proxies  map[string]*Proxy
	cons     []*consumerProc
	js       jetstream.JetStream

	mu        sync.Mutex
	published map[string]*Published
	routes    map[string]int // publications by route
	exactDup  int            // exact re-publications JetStream dropped
	retries   int            // publishes the driver had to repeat (broker down)
	replayErr int
	lastSeq   uint64
	faults    map[string]int
	faultErrs []string

	linkMu map[string]*sync.Mutex
	// viaPgBouncer: the consumers reach Postgres through bouncer, a
	// pgbouncer in transaction mode in front of the cluster (see
	// pgbouncer_test.go).
	viaPgBouncer bool
	bouncer      *testenv.PgBouncer
	// viaFormation: the ledger is a pg_auto_failover formation, reached by
	// its multi-host URL (see failover_test.go); failovers are the times
	// its postgres_failover faults took to recover.
	viaFormation bool
	formation    *testenv.Formation
	failovers    []time.Duration

	natsMu sync.Mutex
	pgMu   sync.Mutex
	sbMu   sync.Mutex
	consMu sync.Mutex
}

func TestSoak(t *testing.T) {
	for _, executor := range executors() {
		t.Run(executor, func(t *testing.T) { soak(t, executor) })
	}
}

// soak is one run, with the sandbox's tools reached by executor.
func soak(t *testing.T, executor string) {
	sz := sizeOf()
	seed := *flagSeed
	dir, err := os.MkdirTemp("", "toolq-soak-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || *flagKeep {
			t.Logf("soak: the run is kept in %s (seed %d)", dir, seed)
			return
		}
		os.RemoveAll(dir)
	})
	r := &run{t: t, executor: executor, dir: dir, published: map[string]*Published{}, routes: map[string]int{}, faults: map[string]int{},
		proxies: map[string]*Proxy{}, linkMu: map[string]*sync.Mutex{}}
	r.setup()

	ctx, cancel := context.WithTimeout(context.Background(), sz.window+sz.settle+time.Minute)
	defer cancel()
	evs := plan(seed, sz.jobs)
	fs := schedule(seed, sz.faults, sz.window, ackWait+toolLease/2, consumers)
	t.Logf("soak: the consumers reach the sandbox's tools by %s", executor)
	t.Logf("soak: seed %d, %d calls, %d publish events, %d faults over %v", seed, sz.jobs, len(evs), len(fs), sz.window)

	watchCtx, stopWatch := context.WithCancel(ctx)
	var watch sync.WaitGroup
	watch.Add(1)
	go func() { defer watch.Done(); r.watchdog(watchCtx) }()

	start := time.Now()
	var faults sync.WaitGroup
	for _, f := range fs {
		faults.Add(1)
		go func() {
			defer faults.Done()
			ctxSleep(ctx, time.Until(start.Add(f.at)))
			r.inject(ctx, f)
		}()
	}
	r.drive(ctx, evs, start, sz.window*9/10)
	faults.Wait()
	for _, p := range r.proxies {
		p.Heal()
	}
	sandboxFaults(r.sbURL, `{"drop_after_effect_rate":0}`)
	t.Logf("soak: load and faults done after %v; waiting for every job to settle", time.Since(start).Round(time.Millisecond))

	pending := r.awaitSettled(ctx, time.Now().Add(sz.settle))
	t.Logf("soak: settled after %v (%d tool_use_id(s) unsettled)", time.Since(start).Round(time.Millisecond), len(pending))
	stopWatch()
	watch.Wait()
	outcomes := r.stopConsumers()

	obs := r.observe(ctx)
	fig, vs := Check(obs)
	report := r.report(seed, sz, fig, vs, outcomes)
	os.WriteFile(filepath.Join(dir, "report.txt"), []byte(report), 0o644)
	t.Log("\n" + report)
	if len(r.faultErrs) > 0 {
		t.Errorf("soak: %d fault(s) could not be injected or undone: %s", len(r.faultErrs), strings.Join(r.faultErrs, "; "))
	}
	// Every scheduled fault was injected: a run that skipped some proves
	// less than its report claims.
	scheduled := map[string]int{}
	for _, f := range fs {
		scheduled[f.kind]++
	}
	for kind, n := range scheduled {
		if r.faults[kind] != n {
			t.Errorf("soak: %d of %d %s faults injected", r.faults[kind], n, kind)
		}
	}
	if len(scheduled) != len(faultKinds()) {
		t.Errorf("soak: %d fault kinds scheduled, want all %d", len(scheduled), len(faultKinds()))
	}
	if len(vs) > 0 {
		t.Errorf("soak: %d VIOLATION(S) of toolq's promise with seed %d; the run is kept in %s", len(vs), seed, dir)
	}
}

// setup builds the binaries and starts Postgres, nats-server, the sandbox,
// the proxies and the consumers.
func (r *run) setup() {
	t := r.t
	bin := filepath.Join(r.dir, "bin")
	buildBinaries(t, bin)

	// Every commit that waits for the disk survives a crash (the machine
	// does not crash: fsync stays off); a keyed write's claim does not wait.
	var pgTarget string
	if r.viaFormation {
		r.formation = testenv.StartFormation(t)
		r.dbURL = r.formation.URL()
		pgTarget = r.formation.NodeAddr(0) // the proxy's; the consumers use both nodes
	} else {
		r.cluster = testenv.OwnCluster(t, "synchronous_commit=on")
		r.dbURL = r.cluster.Database(t)
		pgTarget = fmt.Sprintf("127.0.0.1:%d", r.cluster.Port)
	}

	r.nats = &natsProc{bin: filepath.Join(bin, "nats-server"), dir: filepath.Join(r.dir, "jetstream"), log: filepath.Join(r.dir, "nats-server.log"),
		port: freePort(t), mport: freePort(t)}
	if err := r.nats.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.nats.p.stop(10 * time.Second) })

	sb, sbURL, err := startProc(filepath.Join(bin, "sandbox"), []string{"--listen", "127.0.0.1:0", "--state", filepath.Join(r.dir, "sandbox.json"), "--latency", sandboxLatency.String()},
		nil, filepath.Join(r.dir, "sandbox.log"), regexp.MustCompile(`sandbox API on (http://\S+)`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.stop(5 * time.Second) })
	r.sbURL = sbURL

	targets := map[string]string{
		"nats":     fmt.Sprintf("127.0.0.1:%d", r.nats.port),
		"postgres": pgTarget,
		"sandbox":  strings.TrimPrefix(sbURL, "http://"),
	}
	consumerDB := r.dbURL
	if r.viaPgBouncer {
		r.bouncer = testenv.StartPgBouncer(t, r.cluster.URL("postgres"))
		targets["postgres"] = r.bouncer.Addr()
		consumerDB = r.bouncer.Through(t, r.dbURL)
	}
	for _, l := range links {
		p, err := NewProxy(l, targets[l])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		r.proxies[l], r.linkMu[l] = p, &sync.Mutex{}
	}

	nc, err := nats.Connect(r.nats.url(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if r.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	if err := jobs.ProvisionStreams(context.Background(), r.js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}

	registry := filepath.Join(r.dir, "tools.yaml")
	reg, err := registryFor(r.executor)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(registry, []byte(reg), 0o644); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(consumerDB)
	u.Host = r.proxies["postgres"].Addr()
	dbArg := u.String()
	if r.viaFormation {
		dbArg = r.dbURL // both nodes, not through the proxy
	}
	for i := range consumers {
		c := &consumerProc{idx: i, bin: filepath.Join(bin, "consumer"), log: filepath.Join(r.dir, fmt.Sprintf("consumer-%d.log", i)),
			args: []string{"run", "--nats-url", "nats://" + r.proxies["nats"].Addr(), "--database-url", dbArg, "--tools", registry,
				"--health-addr", "127.0.0.1:0", "--ack-wait", ackWait.String(), "--shutdown-timeout", "5s", "--workers", "16", "--batch", "8"},
			env: []string{"TOOLQ_SANDBOX_URL=http://" + r.proxies["sandbox"].Addr()}}
		if err := c.startRetrying(time.Now().Add(30 * time.Second)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if c.p != nil && c.p.alive() {
				c.p.kill()
			}
		})
		r.cons = append(r.cons, c)
	}
}

// drive publishes the plan, paced over span.
func (r *run) drive(ctx context.Context, evs []event, start time.Time, span time.Duration) {
	client := jobs.NewClient(r.js)
	sent := make([]jobs.Job, len(evs))
	every := span / time.Duration(max(1, len(evs)))
	for i, ev := range evs {
		if !ev.burst {
			ctxSleep(ctx, time.Until(start.Add(time.Duration(i)*every)))
		}
		if ctx.Err() != nil {
			return
		}
		switch ev.route {
		case routeReplay:
			r.mu.Lock()
			last := r.lastSeq
			r.mu.Unlock()
			if last == 0 {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			out, err := operate.Replay(rctx, r.js, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: max(1, last-19), ToSeq: last}, false)
			cancel()
			r.mu.Lock()
			r.routes[routeReplay] += len(out)
			if err != nil {
				r.replayErr++
			}
			r.mu.Unlock()
		case routeExact:
			j := sent[ev.of]
			pub := r.publish(ctx, client, &j)
			r.mu.Lock()
			r.routes[routeExact]++
			if pub.Duplicate {
				r.exactDup++
			}
			r.mu.Unlock()
		default:
			j := ev.job
			key, err := j.Key()
			if err != nil {
				r.t.Fatalf("soak: plan made an invalid job: %v", err)
			}
			r.mu.Lock()
			r.published[j.ToolUseID] = &Published{Job: j, Key: key, Class: classOf[j.Tool], Route: ev.route}
			r.routes[ev.route]++
			r.mu.Unlock()
			r.publish(ctx, client, &j)
			sent[i] = j
			r.mu.Lock()
			r.published[j.ToolUseID].Job = j // with its created_at
			r.mu.Unlock()
		}
	}
}

// publish publishes j until JetStream acknowledges it: a broker restart
// makes the driver repeat it, with the same Nats-Msg-Id.
func (r *run) publish(ctx context.Context, client *jobs.Client, j *jobs.Job) jobs.Published {
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		pub, err := client.Publish(pctx, j)
		cancel()
		if err == nil {
			r.mu.Lock()
			r.lastSeq = max(r.lastSeq, pub.Sequence)
			r.mu.Unlock()
			return pub
		}
		if ctx.Err() != nil {
			r.t.Fatalf("soak: publish %s: %v", j.ToolUseID, err)
		}
		r.mu.Lock()
		r.retries++
		r.mu.Unlock()
		ctxSleep(ctx, 200*time.Millisecond)
	}
}

// inject applies one fault and undoes it after its duration.
func (r *run) inject(ctx context.Context, f fault) {
	fail := func(err error) {
		r.mu.Lock()
		r.faultErrs = append(r.faultErrs, fmt.Sprintf("%s: %v", f.kind, err))
		r.mu.Unlock()
	}
	switch {
	case f.kind == faultKill:
		c := r.pickConsumer(ctx, f.target)
		if c == nil {
			return
		}
		c.p.kill()
		ctxSleep(ctx, f.dur)
		if err := c.startRetrying(time.Now().Add(60 * time.Second)); err != nil {
			fail(err)
		}
		r.release(c)
	case f.kind == faultStop:
		c := r.pickConsumer(ctx, f.target)
		if c == nil {
			return
		}
		c.p.signal(syscall.SIGSTOP)
		ctxSleep(ctx, f.dur)
		c.p.signal(syscall.SIGCONT)
		r.release(c)
	case f.kind == faultNATS:
		r.natsMu.Lock()
		if err := r.nats.restart(f.dur); err != nil {
			fail(err)
		}
		r.natsMu.Unlock()
	case f.kind == faultPostgres, f.kind == faultCrash:
		r.pgMu.Lock()
		stop := r.cluster.Stop
		if f.kind == faultCrash {
			stop = r.cluster.Crash
		}
		if err := stop(); err != nil {
			fail(err)
		}
		ctxSleep(ctx, f.dur)
		if err := r.cluster.Start(); err != nil {
			fail(err)
		}
		r.pgMu.Unlock()
	case f.kind == faultFailover:
		r.pgMu.Lock()
		if err := r.failover(ctx, f.dur); err != nil {
			fail(err)
		}
		r.pgMu.Unlock()
	case f.kind == faultDrop, f.kind == faultRedirect:
		knob := "drop_after_effect_rate"
		if f.kind == faultRedirect {
			knob = "redirect_after_effect_rate"
		}
		r.sbMu.Lock()
		if err := sandboxFaults(r.sbURL, fmt.Sprintf(`{%q:%.3f}`, knob, f.rate)); err != nil {
			fail(err)
		}
		ctxSleep(ctx, f.dur)
		if err := sandboxFaults(r.sbURL, fmt.Sprintf(`{%q:0}`, knob)); err != nil {
			fail(err)
		}
		r.sbMu.Unlock()
	case strings.HasPrefix(f.kind, faultReset):
		r.proxies[strings.TrimPrefix(f.kind, faultReset)].Reset()
	case strings.HasPrefix(f.kind, faultLatency):
		l := strings.TrimPrefix(f.kind, faultLatency)
		r.linkMu[l].Lock()
		r.proxies[l].SetLatency(f.amount)
		ctxSleep(ctx, f.dur)
		r.proxies[l].SetLatency(0)
		r.linkMu[l].Unlock()
	case strings.HasPrefix(f.kind, faultBlackHole):
		l := strings.TrimPrefix(f.kind, faultBlackHole)
		r.linkMu[l].Lock()
		r.proxies[l].BlackHole()
		ctxSleep(ctx, f.dur)
		r.proxies[l].Heal()
		r.linkMu[l].Unlock()
	}
	r.mu.Lock()
	r.faults[f.kind]++
	r.mu.Unlock()
}

// pickConsumer takes a running consumer for a fault, starting at target,
// and never the last one that is free: one consumer always runs.
func (r *run) pickConsumer(ctx context.Context, target int) *consumerProc {
	for ctx.Err() == nil {
		r.consMu.Lock()
		busy := 0
		for _, c := range r.cons {
			c.mu.Lock()
			if c.busy {
				busy++
			}
			c.mu.Unlock()
		}
		if busy < len(r.cons)-1 {
			for k := range r.cons {
				c := r.cons[(target+k)%len(r.cons)]
				c.mu.Lock()
				ok := !c.busy && c.p != nil && c.p.alive()
				if ok {
					c.busy = true
				}
				c.mu.Unlock()
				if ok {
					r.consMu.Unlock()
					return c
				}
			}
		}
		r.consMu.Unlock()
		ctxSleep(ctx, 100*time.Millisecond)
	}
	return nil
}

func (r *run) release(c *consumerProc) {
	r.consMu.Lock()
	c.mu.Lock()
	c.busy = false
	c.mu.Unlock()
	r.consMu.Unlock()
}

// watchdog restarts a consumer that exited when no fault holds it, and
// scrapes the consumers' metrics every second.
func (r *run) watchdog(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, c := range r.cons {
			c.mu.Lock()
			dead := !c.busy && c.p != nil && !c.p.alive()
			if dead {
				c.busy = true
				c.exits++
			}
			c.mu.Unlock()
			if dead {
				if err := c.startRetrying(time.Now().Add(60 * time.Second)); err != nil {
					r.mu.Lock()
					r.faultErrs = append(r.faultErrs, fmt.Sprintf("restart consumer %d: %v", c.idx, err))
					r.mu.Unlock()
				}
				r.release(c)
				continue
			}
			c.scrape()
		}
	}
}

// stopConsumers scrapes the consumers' metrics a last time, stops them with
// SIGTERM (a drain) and sums toolq_jobs_total by outcome over every process
// that ran (a killed process's last second is missing).
func (r *run) stopConsumers() map[string]float64 {
	sum := map[string]float64{}
	for _, c := range r.cons {
		c.scrape()
		c.p.stop(15 * time.Second)
		for _, inc := range c.outcomes {
			for k, v := range inc {
				sum[k] += v
			}
		}
	}
	return sum
}

// awaitSettled waits until every published tool_use_id has a result or a
// dead letter, or the deadline; it returns those that have neither.
func (r *run) awaitSettled(ctx context.Context, deadline time.Time) []string {
	answered := map[string]bool{}
	var from uint64 = 1
	for {
		msgs, next, err := readStream(ctx, r.js, jobs.ResultsStream, from)
		if err == nil {
			from = next
			for _, m := range msgs {
				if res, err := jobs.DecodeResult(m); err == nil {
					answered[res.ToolUseID] = true
				}
			}
		}
		if dls, err := operate.ListDeadLetters(ctx, r.js, ""); err == nil {
			for _, d := range dls {
				answered[d.ToolUseID] = true
			}
		}
		var pending []string
		r.mu.Lock()
		for id := range r.published {
			if !answered[id] {
				pending = append(pending, id)
			}
		}
		r.mu.Unlock()
		if len(pending) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			sort.Strings(pending)
			return pending
		}
		ctxSleep(ctx, 500*time.Millisecond)
	}
}

// readStream reads the bodies of stream from sequence from to its last
// message and returns the sequence after the last one read.
func readStream(ctx context.Context, js jetstream.JetStream, stream string, from uint64) ([][]byte, uint64, error) {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from})
	if err != nil {
		return nil, from, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, from, err
	}
	var out [][]byte
	next := from
	for left := info.NumPending; left > 0; {
		batch, err := cons.Fetch(int(min(left, 512)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return out, next, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			left--
			meta, err := m.Metadata()
			if err != nil {
				return out, next, err
			}
			out = append(out, m.Data())
			next = meta.Sequence.Stream + 1
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return out, next, err
		}
		if got == 0 {
			return out, next, fmt.Errorf("read %s: %d message(s) unread", stream, left)
		}
	}
	return out, next, nil
}

// observe reads everything the checker compares: the results and dead
// letters, the ledger, and the sandbox's effects.
func (r *run) observe(ctx context.Context) Observed {
	t := r.t
	o := Observed{Published: r.published, Rows: map[string]ledger.Row{}}
	bodies, _, err := readStream(ctx, r.js, jobs.ResultsStream, 1)
	if err != nil {
		t.Fatalf("soak: read the results: %v", err)
	}
	for _, b := range bodies {
		res, err := jobs.DecodeResult(b)
		if err != nil {
			t.Errorf("soak: a result that does not decode: %v: %s", err, b)
			continue
		}
		o.Results = append(o.Results, *res)
	}
	if o.DeadLetters, err = operate.ListDeadLetters(ctx, r.js, ""); err != nil {
		t.Fatalf("soak: read the dead letters: %v", err)
	}
	store, err := ledger.OpenPostgres(ctx, r.dbURL)
	if err != nil {
		t.Fatalf("soak: open the ledger: %v", err)
	}
	defer store.Close()
	rows, err := store.List(ctx, ledger.Filter{Limit: 10_000_000})
	if err != nil {
		t.Fatalf("soak: list the ledger: %v", err)
	}
	for _, row := range rows {
		o.Rows[row.Key] = row
	}
	var ps struct{ Data []sandbox.Payment }
	var ts struct{ Data []sandbox.Ticket }
	if err := getJSON(r.sbURL+"/v1/payments", &ps); err != nil {
		t.Fatalf("soak: sandbox payments: %v", err)
	}
	if err := getJSON(r.sbURL+"/v1/tickets", &ts); err != nil {
		t.Fatalf("soak: sandbox tickets: %v", err)
	}
	o.Payments, o.Tickets = ps.Data, ts.Data
	return o
}

func getJSON(u string, v any) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// report prints what the run did and what the checker found.
func (r *run) report(seed uint64, sz size, f Figures, vs []Violation, outcomes map[string]float64) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("toolq soak, seed %d: %d calls, %d faults of each kind over %v, %d consumers, tools reached by the %s executor", seed, sz.jobs, sz.faults, sz.window, consumers, r.executor)
	p("")
	p("published")
	p("  tool_use_ids %d, keys %d", f.ToolUseIDs, f.Keys)
	byTool := map[string]int{}
	for _, pj := range r.published {
		byTool[pj.Job.Tool]++
	}
	p("  by tool: %s %d, %s %d, %s %d, %s %d (in bursts of %d at one slot)", toolPayment, byTool[toolPayment], toolTicket, byTool[toolTicket],
		toolSearch, byTool[toolSearch], toolQueued, byTool[toolQueued], queuedBurst)
	p("  duplicates by route: retried turn (new tool_use_id) %d, exact re-publication %d (%d dropped by Nats-Msg-Id), operator replay %d messages (%d replay(s) failed), driver re-publish after a broker error %d",
		r.routes[routeRetriedTurn], r.routes[routeExact], r.exactDup, r.routes[routeReplay], r.replayErr, r.retries)
	delivered := 0.0
	for _, v := range outcomes {
		delivered += v
	}
	var oks []string
	for _, k := range sortedKeys(outcomes) {
		oks = append(oks, fmt.Sprintf("%s %.0f", k, outcomes[k]))
	}
	p("  deliveries processed by the consumers (toolq_jobs_total, at least): %.0f: %s", delivered, strings.Join(oks, ", "))
	var exits int
	for _, c := range r.cons {
		exits += c.exits
	}
	p("")
	p("faults")
	var total int
	for _, k := range faultKinds() {
		p("  %-26s %d", k, r.faults[k])
		total += r.faults[k]
	}
	p("  total %d; consumer exits nobody asked for: %d", total, exits)
	p("")
	p("observed")
	p("  results %d (ok %d, error %d, indeterminate %d, rejected %d); answered from the ledger for another tool_use_id %d; repeated for one tool_use_id %d",
		f.Results, f.ResultsByStatus[jobs.StatusOK], f.ResultsByStatus[jobs.StatusError], f.ResultsByStatus[jobs.StatusIndeterminate], f.ResultsByStatus[jobs.StatusRejected], f.DuplicateResults, f.RepeatedResults)
	var dls []string
	for _, k := range sortedKeys(f.DeadLetters) {
		dls = append(dls, fmt.Sprintf("%s %d", k, f.DeadLetters[k]))
	}
	p("  dead letters %d tool_use_id(s) [%s]", f.DeadLetteredIDs, strings.Join(dls, ", "))
	p("  ledger: completed %d, failed %d, indeterminate %d, in_flight %d; rows taken over (attempt > 1) %d",
		f.LedgerByState[ledger.Completed], f.LedgerByState[ledger.Failed], f.LedgerByState[ledger.Indeterminate], f.LedgerByState[ledger.InFlight], f.TakenOver)
	p("  sandbox: payments %d, tickets %d", f.Payments, f.Tickets)
	p("")
	p("checks")
	p("  lost (no result, no dead letter)                         %d", f.Lost)
	p("  keyed_write keys ok, each with exactly one payment       %d", f.KeyedOK)
	p("  unkeyed_write keys completed with their one ticket       %d", f.UnkeyedOK)
	p("  unkeyed_write keys indeterminate (of which applied)      %d (%d)", f.Indeterminate, f.IndeterminateEffect)
	p("  silent duplicates / silent uncertain outcomes            %d", f.SilentDuplicates)
	kinds := map[string][]Violation{}
	for _, v := range vs {
		kinds[v.Kind] = append(kinds[v.Kind], v)
	}
	p("  violations                                               %d", len(vs))
	for _, k := range sortedKeys(kinds) {
		p("    %s: %d", k, len(kinds[k]))
		for i, v := range kinds[k] {
			if i == 10 {
				p("      … %d more", len(kinds[k])-10)
				break
			}
			p("      %s", v.Detail)
		}
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
