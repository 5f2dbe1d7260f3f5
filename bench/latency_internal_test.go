package bench

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// latencySetup is a bench with what its latency runs need, the consumer
// and the naive dispatcher in this process: NATS, the ledger's Postgres, a
// sandbox and the result watch.
func latencySetup(t *testing.T, cfg Config) *bench {
	t.Helper()
	ctx := context.Background()
	cfg.NATSURL, cfg.DatabaseURL, cfg.InProcess = testenv.StartNATS(t).URL, testenv.Postgres(t), true
	cfg.fill()
	cfg.Logger = slog.New(slog.DiscardHandler)
	b := &bench{cfg: cfg, quiet: cfg.Logger}
	var err error
	if b.nc, err = nats.Connect(cfg.NATSURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.nc.Close)
	if b.js, err = jetstream.New(b.nc); err != nil {
		t.Fatal(err)
	}
	if b.store, err = ledger.Open(ctx, cfg.DatabaseURL, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.store.Close)
	if err := b.store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if b.pg, err = pgx.Connect(ctx, cfg.DatabaseURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.pg.Close(context.Background()) })
	if b.sandbox, err = sandbox.New(sandbox.Config{}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: b.sandbox}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	b.url, b.client = "http://"+ln.Addr().String(), toolClient(cfg.Concurrency)
	if err := jobs.ProvisionStreams(ctx, b.js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	if b.results, err = watchResults(b.nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.results.stop)
	return b
}

// TestTheComparedBuildsLatencyIsKeptAtEachRate: with --compare --rate 100,
// the compared build's latency at the fixed rate is in Compare.Lat and its
// latency at 100/s in Compare.Lat100, as for any other rate.
func TestTheComparedBuildsLatencyIsKeptAtEachRate(t *testing.T) {
	b := latencySetup(t, Config{LatencyFor: 40 * time.Millisecond, WarmUp: 20 * time.Millisecond, Settle: -1, Concurrency: 4})
	r := &Report{Compare: &Comparison{}}
	a := build{pay: "pay", slow: "slow"}
	if err := b.latencies(context.Background(), r, 100, a, a); err != nil {
		t.Fatal(err)
	}
	if r.ToolqLat.Jobs != 4 || r.ToolqLat100.Jobs != 4 {
		t.Fatalf("the consumer's latency runs: %d and %d jobs, want 4 each", r.ToolqLat.Jobs, r.ToolqLat100.Jobs)
	}
	if r.Compare.Lat.Jobs != 4 || r.Compare.Lat.Rate != 100 || r.Compare.Lat100.Jobs != 4 {
		t.Errorf("the compared build's latency at the fixed rate (100/s): %+v; at 100/s: %+v; want 4 jobs each",
			r.Compare.Lat, r.Compare.Lat100)
	}
}

// TestALatencyRunCountsNoneOfItsWarmUp: a latency run first sends its
// warm-up's jobs at the rate (they reach the tool: the process opens its
// connections on them), and counts only the jobs after them.
func TestALatencyRunCountsNoneOfItsWarmUp(t *testing.T) {
	for _, tc := range []struct {
		name string
		of   *build
	}{{"naive", nil}, {"toolq", &build{pay: "pay"}}} {
		t.Run(tc.name, func(t *testing.T) {
			b := latencySetup(t, Config{WarmUp: 300 * time.Millisecond, Settle: -1, Concurrency: 4})
			got, err := b.latencyRun(context.Background(), 100, tc.of, nil, 5)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.lat) != 5 || len(got.sent) != 5 {
				t.Errorf("%d latencies of %d jobs sent, want the 5 counted", len(got.lat), len(got.sent))
			}
			if n := len(b.sandbox.Payments()); n != 30+5 {
				t.Errorf("the tool was called %d times, want 30 warm-up calls and 5 counted", n)
			}
		})
	}
}

// TestALatencyRunWaitsForTheMachineToSettleAfterItsWarmUp: on a machine
// kept busy by another process, the counted jobs of a latency run start
// only after its warm-up and its whole Settle.
func TestALatencyRunWaitsForTheMachineToSettleAfterItsWarmUp(t *testing.T) {
	keepACoreBusy(t)
	b := latencySetup(t, Config{WarmUp: 100 * time.Millisecond, Settle: time.Second, Concurrency: 4})
	began := time.Now()
	got, err := b.latencyRun(context.Background(), 100, &build{pay: "pay"}, nil, 5)
	if err != nil {
		t.Fatal(err)
	}
	first := slices.MinFunc(slices.Collect(maps.Values(got.sent)), time.Time.Compare)
	if waited := first.Sub(began); waited < 1100*time.Millisecond {
		t.Errorf("the first counted job was sent %v after the run began: want its 100ms warm-up and its 1s settle first", waited)
	}
}

// TestALatencyRunInHalvesIsOneRun: a build's two halves of a latency run
// count as one run: the percentiles of all their jobs, and the share of
// their time the hypervisor took over both (not the mean of the halves'
// shares: a longer half weighs more), the gap between them left out.
func TestALatencyRunInHalvesIsOneRun(t *testing.T) {
	t.Parallel()
	first := latencySample{lat: []float64{1, 2, 3, 4}, from: machineTime{steal: 10, all: 100}, to: machineTime{steal: 11, all: 110}}  // 10 %
	second := latencySample{lat: []float64{5, 6, 7, 8}, from: machineTime{steal: 50, all: 500}, to: machineTime{steal: 53, all: 540}} // 7.5 %
	got := latencyOf(100, first, second)
	if got.Jobs != 8 || got.P50ms != 5 || got.MaxMs != 8 {
		t.Errorf("jobs %d, p50 %.0f, max %.0f: want 8 jobs, p50 5, max 8", got.Jobs, got.P50ms, got.MaxMs)
	}
	if want := 100 * 4.0 / 50; math.Abs(got.StealPct-want) > 1e-9 {
		t.Errorf("steal over both halves: %.2f %%, want %.2f %% (4 s of 50)", got.StealPct, want)
	}
}

// TestALatencyRunsStealCountsOnlyTheRunsItRead: a run whose machine time
// was not read at one end (readMachineTime's zero) adds no steal of its
// own: not the machine's since it booted, and not a negative time that
// hides the other half's; with no /proc at all the steal is 0, not NaN.
func TestALatencyRunsStealCountsOnlyTheRunsItRead(t *testing.T) {
	t.Parallel()
	read := latencySample{lat: []float64{1}, from: machineTime{steal: 10, all: 100}, to: machineTime{steal: 11, all: 110}} // 10 %
	for _, tc := range []struct {
		name string
		runs []latencySample
		want float64
	}{
		{"no first reading", []latencySample{{lat: []float64{1}, to: machineTime{steal: 5000, all: 100000}}}, 0},
		{"a half with no last reading", []latencySample{read, {lat: []float64{2}, from: machineTime{steal: 50, all: 500}}}, 10},
		{"a half with no first reading", []latencySample{read, {lat: []float64{2}, to: machineTime{steal: 5000, all: 100000}}}, 10},
		{"no /proc", []latencySample{{lat: []float64{1}}, {lat: []float64{2}}}, 0},
	} {
		if got := latencyOf(100, tc.runs...).StealPct; math.IsNaN(got) || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: steal %v %%, want %v %%", tc.name, got, tc.want)
		}
	}
}

// TestALatencyRunsStealWindowIsItsCountedJobs: the machine's time a
// latency run reads its steal over begins after its warm-up and ends with
// its counted jobs: some of it, and far less than the warm-up's second.
func TestALatencyRunsStealWindowIsItsCountedJobs(t *testing.T) {
	b := latencySetup(t, Config{WarmUp: time.Second, Settle: -1, Concurrency: 4})
	before := readMachineTime()
	if before.all == 0 {
		t.Fatal("no /proc/stat on this machine")
	}
	got, err := b.latencyRun(context.Background(), 100, &build{pay: "pay"}, nil, 5)
	if err != nil {
		t.Fatal(err)
	}
	if warm, window := got.from.all-before.all, got.to.all-got.from.all; window <= 0 || window > warm/4 {
		t.Errorf("the steal window spans %.2f s of the machine's time, the warm-up before it %.2f s: want some, and far less than the warm-up's (5 jobs at 100/s against 1 s)", window, warm)
	}
}

// TestALatencyRunsProfilesAreOfItsCountedJobs: with ProfileDir, a latency
// run asks its consumer process, when its counted jobs begin, for a CPU
// profile, an execution trace and a delta of its allocations over the
// window of those jobs (their publishing at the rate and a second, in
// whole seconds), and writes each to the run's files; the process is not
// asked to profile its life (no --debug-cpuprofile or --debug-trace),
// which would hold its start, its warm-up and its settle.
func TestALatencyRunsProfilesAreOfItsCountedJobs(t *testing.T) {
	t.Parallel()
	type ask struct {
		path, seconds string
		at            time.Time
	}
	asked := make(chan ask, 10)
	debug := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/pprof/heap" { // the collections around the window
			asked <- ask{r.URL.Path, r.URL.Query().Get("seconds"), time.Now()}
		}
		fmt.Fprint(w, "the "+path.Base(r.URL.Path))
	}))
	defer debug.Close()
	dir := t.TempDir()
	b := &bench{cfg: Config{ProfileDir: dir, Logger: slog.New(slog.DiscardHandler)}, profileName: "latency-300"}
	window := countedWindow(450, 300) // 1.5 s of publishing
	if window != 3*time.Second {
		t.Fatalf("the window of 450 jobs at 300/s: %s, want 3s (1.5 s rounded up, and a second)", window)
	}
	start := time.Now()
	b.captureCounted(context.Background(), &running{debug: []string{strings.TrimPrefix(debug.URL, "http://")}}, window)()
	close(asked)
	got := map[string]string{}
	for a := range asked {
		got[a.path] = a.seconds
		if d := a.at.Sub(start); d > time.Second {
			t.Errorf("%s asked for %s after the counted jobs began", a.path, d)
		}
	}
	want := map[string]string{"/debug/pprof/profile": "3", "/debug/pprof/trace": "3", "/debug/pprof/allocs": "4"} // allocations: a second more, for the collection after the counted jobs
	if !maps.Equal(got, want) {
		t.Errorf("asked for %v, want %v", got, want)
	}
	for file, body := range map[string]string{"latency-300.prof": "the profile", "latency-300.trace": "the trace", "latency-300.allocs": "the allocs"} {
		if data, err := os.ReadFile(filepath.Join(dir, file)); err != nil || string(data) != body {
			t.Errorf("%s: %q, %v; want %q", file, data, err, body)
		}
	}
	p := &consumerProc{health: "127.0.0.1:1", stderr: &strings.Builder{}}
	for _, name := range []string{"latency-300", "fresh-1"} {
		b.profileName = name
		args := b.consumerArgs(p, "durable", "tool", 0, 1)
		lifelong := slices.Contains(args, "--debug-cpuprofile") || slices.Contains(args, "--debug-trace")
		if lifelong == isLatencyRun(name) {
			t.Errorf("run %s: the process's arguments %v", name, args)
		}
	}
}
