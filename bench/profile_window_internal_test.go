package bench

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// allocSink keeps allocate's slices from being optimised away.
var allocSink [][]byte

// allocate allocates mib MiB on the heap, in 1 MiB slices.
func allocate(mib int) {
	for range mib {
		allocSink = append(allocSink, make([]byte, 1<<20))
	}
	allocSink = nil
}

// TestALatencyRunsAllocationsAreThoseOfItsWindow: a latency run's .allocs
// holds what the process allocated over the window of its counted jobs,
// not what it allocated before them (its warm-up's), whenever the process
// collected garbage. A heap profile shows an allocation only once a
// collection has swept after it: a consumer collecting once in the window
// (GOGC 400: once every 0.61 s at 1,712/s, so every 10 s or so at
// 100/s) publishes what it allocated before the window in it, and what it
// allocated in the window after that is not published when the window ends.
func TestALatencyRunsAllocationsAreThoseOfItsWindow(t *testing.T) {
	// Not parallel: it sets when this process collects garbage.
	addr := servePprof(t)
	dir := t.TempDir()
	b := &bench{cfg: Config{ProfileDir: dir, Logger: slog.New(slog.DiscardHandler)}, profileName: "latency-100"}
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// Every allocation recorded: sampled at 512 KiB, 64 allocations of 1 MiB
	// count 64 MiB ± 3.2 MiB, outside 56-72 MiB in 1.1 % of runs.
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	allocate(32) // the warm-up's, not yet collected when the counted jobs begin
	captured := b.captureCounted(context.Background(), &running{debug: []string{addr}}, countedWindow(100, 100))
	time.Sleep(300 * time.Millisecond) // the process has been asked
	runtime.GC()                       // its one collection in the window
	allocate(64)                       // the counted jobs'
	captured()
	got := readProfile(t, filepath.Join(dir, "latency-100.allocs")).total("alloc_space", "bench.allocate")
	if got < 64<<20 || got > 65<<20 {
		t.Errorf("latency-100.allocs: %.1f MiB allocated, want the window's 64 MiB (not the 32 MiB allocated before it)", float64(got)/(1<<20))
	}
}

// servePprof serves this process's Go profiles, as a consumer's
// --debug-pprof does, until the test ends, and returns their address.
func servePprof(t *testing.T) string {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// buildConsumer builds the consumer binary into a directory of the test's.
func buildConsumer(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "github.com/toolq/toolq/cmd/consumer").CombinedOutput(); err != nil {
		t.Fatalf("build the consumer: %v\n%s", err, out)
	}
	return filepath.Join(dir, "consumer")
}

// profiledLatencySetup is latencySetup with a profile directory and the
// tools file of the consumer processes.
func profiledLatencySetup(t *testing.T, cfg Config) *bench {
	t.Helper()
	cfg.ProfileDir = t.TempDir()
	b := latencySetup(t, cfg)
	var err error
	if b.toolsFile, err = b.writeTools(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestALatencyRunsAllocationProfileHoldsItsCountedJobs: the consumer
// itself, 300 jobs at 100/s: its latency run's .allocs holds their
// allocations by toolq's code (a fresh job allocates about 30 KiB; at
// least 2 KB each), not only the profiler's own.
func TestALatencyRunsAllocationProfileHoldsItsCountedJobs(t *testing.T) {
	t.Parallel()
	bin := buildConsumer(t)
	b := profiledLatencySetup(t, Config{WarmUp: time.Second, Settle: -1, Concurrency: 8})
	b.profileName = "latency-100"
	if _, err := b.latencyRun(context.Background(), 100, &build{bin: bin, pay: "pay"}, nil, 300); err != nil {
		t.Fatal(err)
	}
	p := readProfile(t, filepath.Join(b.cfg.ProfileDir, "latency-100.allocs"))
	if got := p.total("alloc_space", "github.com/toolq/toolq/"); got < 300*2000 {
		t.Errorf("latency-100.allocs: %d bytes allocated by toolq's code over %s (%d in all), want those of 300 jobs, 2 KB each at least",
			got, time.Duration(p.durationNanos), p.total("alloc_space", ""))
	}
}

// warnings is a log handler that keeps the warnings' messages and
// attributes.
type warnings struct {
	mu    sync.Mutex
	lines []string
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *warnings) WithGroup(string) slog.Handler            { return w }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return nil
	}
	line := r.Message
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	w.mu.Lock()
	w.lines = append(w.lines, line)
	w.mu.Unlock()
	return nil
}

// TestALatencyRunsProfilesCoverItsLastResultOrSaySo: when the counted
// jobs' results come later than their publishing and a second (here a
// tool taking 1.5 s; a build under comparison that stalls), the latency
// run's profiles either last until the last result or the bench says they
// end before it: the files are not silently of part of the counted jobs.
func TestALatencyRunsProfilesCoverItsLastResultOrSaySo(t *testing.T) {
	t.Parallel()
	bin := buildConsumer(t)
	b := profiledLatencySetup(t, Config{WarmUp: 100 * time.Millisecond, Settle: -1, Concurrency: 64, SlowLatency: 1500 * time.Millisecond})
	logs := &warnings{}
	b.cfg.Logger = slog.New(logs)
	b.profileName = "latency-20"
	got, err := b.latencyRun(context.Background(), 20, &build{bin: bin, pay: "slow"}, nil, 20)
	if err != nil {
		t.Fatal(err)
	}
	p := readProfile(t, filepath.Join(b.cfg.ProfileDir, "latency-20.prof"))
	end := time.Unix(0, p.timeNanos+p.durationNanos)
	lastSent := slices.MaxFunc(slices.Collect(maps.Values(got.sent)), time.Time.Compare)
	lastResult := lastSent.Add(time.Duration(slices.Min(got.lat) * float64(time.Millisecond))) // no earlier than this
	said := slices.ContainsFunc(logs.lines, func(l string) bool { return strings.Contains(l, "latency-20.prof") })
	if lastResult.After(end) && !said {
		t.Errorf("the profiles ended %v before the last counted job's result, and nothing was said (warnings: %q)", lastResult.Sub(end), logs.lines)
	}
}

// TestALatencyRunsProfilesHaveBegunWhenItsCountedJobsDo: captureCounted
// returns, and the first counted job is published, once the process has
// been asked for each of its profiles, not before the request reached it.
func TestALatencyRunsProfilesHaveBegunWhenItsCountedJobsDo(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var asked []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("seconds") != "" { // a profile of the window, not another ask
			mu.Lock()
			asked = append(asked, time.Now())
			mu.Unlock()
		}
		fmt.Fprint(w, "a profile")
	}))
	defer srv.Close()
	b := &bench{cfg: Config{ProfileDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)}, profileName: "latency-1000"}
	captured := b.captureCounted(context.Background(), &running{debug: []string{strings.TrimPrefix(srv.URL, "http://")}}, time.Second)
	returned := time.Now()
	captured()
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 3 || slices.ContainsFunc(asked, func(at time.Time) bool { return at.After(returned) }) {
		t.Errorf("the process was asked at %v after the counted jobs began (at 0); want 3 asks, all before", func() (d []time.Duration) {
			for _, at := range asked {
				d = append(d, at.Sub(returned))
			}
			return d
		}())
	}
}

// TestACaptureThatFailsLeavesNoEarlierFile: when the process does not
// answer for a profile, the run's file is not left as an earlier bench
// made it in the same directory (a consumer's --debug-trace or
// --debug-cpuprofile truncated it at the process's start).
func TestACaptureThatFailsLeavesNoEarlierFile(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/trace") {
			http.Error(w, "tracing is already enabled", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "a profile")
	}))
	defer srv.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "latency-200.trace")
	if err := os.WriteFile(file, []byte("an earlier bench's trace"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &bench{cfg: Config{ProfileDir: dir, Logger: slog.New(slog.DiscardHandler)}, profileName: "latency-200"}
	b.captureCounted(context.Background(), &running{debug: []string{strings.TrimPrefix(srv.URL, "http://")}}, time.Second)()
	if data, err := os.ReadFile(file); err == nil {
		t.Errorf("latency-200.trace holds %q after its capture failed", data)
	}
}

// TestALatencyRunsLateCollectionIsSaid: when the collection made once the
// counted jobs are answered lands after the allocation delta's last
// snapshot (a collection slowed by a busy machine), the .allocs holds none
// of the window's allocations, and the bench says so, naming the file.
func TestALatencyRunsLateCollectionIsSaid(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var heaps int
	var collected, deltaEnd time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch path.Base(r.URL.Path) {
		case "heap": // ?gc=1: runtime.GC, then the heap profile
			mu.Lock()
			heaps++
			slow := heaps > 1
			mu.Unlock()
			if slow {
				time.Sleep(1500 * time.Millisecond) // the end collection, on a busy machine
			}
			mu.Lock()
			collected = time.Now()
			mu.Unlock()
		default: // profile, trace, allocs: last their seconds
			sec, _ := strconv.Atoi(r.URL.Query().Get("seconds"))
			time.Sleep(time.Duration(sec) * time.Second)
			if path.Base(r.URL.Path) == "allocs" {
				mu.Lock()
				deltaEnd = time.Now() // the delta's last snapshot
				mu.Unlock()
			}
		}
		fmt.Fprint(w, "a profile")
	}))
	defer srv.Close()
	logs := &warnings{}
	b := &bench{cfg: Config{ProfileDir: t.TempDir(), Logger: slog.New(logs)}, profileName: "latency-100"}
	start := time.Now()
	captured := b.captureCounted(context.Background(), &running{debug: []string{strings.TrimPrefix(srv.URL, "http://")}}, time.Second)
	time.Sleep(time.Until(start.Add(600 * time.Millisecond))) // the counted jobs answered, within the window
	captured()
	mu.Lock()
	defer mu.Unlock()
	if !collected.After(deltaEnd) {
		t.Fatalf("the end collection at %v, the delta's end at %v: the fake did not make it late", collected, deltaEnd)
	}
	if !slices.ContainsFunc(logs.lines, func(l string) bool { return strings.Contains(l, "latency-100.allocs") }) {
		t.Errorf("the end collection came %v after the allocation delta's last snapshot, and nothing was said (warnings %q)",
			collected.Sub(deltaEnd), logs.lines)
	}
}

// TestALatencyRunsCPUProfileAndTraceHoldNoForcedCollection: the
// collections the bench forces for the allocation delta are not in the
// CPU profile or the execution trace of the counted jobs.
func TestALatencyRunsCPUProfileAndTraceHoldNoForcedCollection(t *testing.T) {
	t.Parallel()
	type span struct {
		path     string
		from, to time.Time
	}
	var mu sync.Mutex
	var windows []span
	var collections []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := path.Base(r.URL.Path)
		if name == "heap" {
			mu.Lock()
			collections = append(collections, time.Now())
			mu.Unlock()
		} else {
			from := time.Now()
			sec, _ := strconv.Atoi(r.URL.Query().Get("seconds"))
			time.Sleep(time.Duration(sec) * time.Second)
			mu.Lock()
			windows = append(windows, span{name, from, time.Now()})
			mu.Unlock()
		}
		fmt.Fprint(w, "a profile")
	}))
	defer srv.Close()
	b := &bench{cfg: Config{ProfileDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)}, profileName: "latency-100"}
	b.captureCounted(context.Background(), &running{debug: []string{strings.TrimPrefix(srv.URL, "http://")}}, time.Second)()
	mu.Lock()
	defer mu.Unlock()
	if len(collections) != 2 {
		t.Errorf("%d collections, want one before the window and one after", len(collections))
	}
	for _, at := range collections {
		for _, s := range windows {
			if (s.path == "profile" || s.path == "trace") && at.After(s.from) && at.Before(s.to) {
				t.Errorf("a forced collection %v into the %s's window (%v long)", at.Sub(s.from), s.path, s.to.Sub(s.from))
			}
		}
	}
}

// TestALatencyRunsProfilerAllocationsAreLeftOutByIgnore: as
// docs/performance.md says, `go tool pprof -ignore
// 'runtime/pprof|net/http/pprof'` leaves the profiler's own allocations
// out of a latency run's .allocs: every sample of its encoding and parsing
// (compress/flate, internal/profile; the delta handler parses its first
// snapshot after the collection before the window, so the collection after
// it publishes that parse) has a frame of one of the two.
func TestALatencyRunsProfilerAllocationsAreLeftOutByIgnore(t *testing.T) {
	// Not parallel: it sets this process's MemProfileRate.
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1 // every allocation, not one in 512 KiB
	addr := servePprof(t)
	dir := t.TempDir()
	b := &bench{cfg: Config{ProfileDir: dir, Logger: slog.New(slog.DiscardHandler)}, profileName: "latency-100"}
	b.captureCounted(context.Background(), &running{debug: []string{addr}}, time.Second)()
	p := readProfile(t, filepath.Join(dir, "latency-100.allocs"))
	i := slices.Index(p.types, "alloc_space")
	if i < 0 {
		t.Fatalf("latency-100.allocs: no alloc_space in %v", p.types)
	}
	var profiler, left int64
	leaves := map[string]bool{}
	for _, s := range p.samples {
		stack := strings.Join(s.funcs, "\n")
		if i >= len(s.values) || s.values[i] == 0 || !strings.Contains(stack, "compress/flate.") && !strings.Contains(stack, "internal/profile.") {
			continue
		}
		profiler += s.values[i]
		if !strings.Contains(stack, "net/http/pprof.") && !strings.Contains(stack, "runtime/pprof.") {
			left += s.values[i]
			leaves[s.funcs[0]] = true
		}
	}
	if profiler == 0 {
		t.Fatal("latency-100.allocs: no allocation of the profiler's encoding or parsing: the test measures nothing")
	}
	if left > 0 {
		t.Errorf("latency-100.allocs: %d of the profiler's %d bytes with no runtime/pprof or net/http/pprof frame (at %v)",
			left, profiler, slices.Sorted(maps.Keys(leaves)))
	}
}

// TestAFailedFirstCollectionIsSaidNamingTheFile: when the collection
// before the window fails, the .allocs holds allocations from before the
// counted jobs, and the warning names that file, as a failed or late
// collection after the window does.
func TestAFailedFirstCollectionIsSaidNamingTheFile(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	heaps := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if path.Base(r.URL.Path) == "heap" {
			mu.Lock()
			heaps++
			first := heaps == 1
			mu.Unlock()
			if first {
				http.Error(w, "busy", http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprint(w, "a profile")
	}))
	defer srv.Close()
	logs := &warnings{}
	b := &bench{cfg: Config{ProfileDir: t.TempDir(), Logger: slog.New(logs)}, profileName: "latency-100"}
	b.captureCounted(context.Background(), &running{debug: []string{strings.TrimPrefix(srv.URL, "http://")}}, time.Second)()
	if !slices.ContainsFunc(logs.lines, func(l string) bool { return strings.Contains(l, "latency-100.allocs") }) {
		t.Errorf("the collection before the window failed, and no warning names latency-100.allocs (warnings %q)", logs.lines)
	}
}

// TestALatencyRunsOnTimeCollectionIsNotSaid: counted jobs answered within
// the window and a collection answered at once are not warned of (no
// other test fails if the late-collection warning is given every time).
func TestALatencyRunsOnTimeCollectionIsNotSaid(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if path.Base(r.URL.Path) != "heap" { // profile, trace, allocs: last their seconds
			sec, _ := strconv.Atoi(r.URL.Query().Get("seconds"))
			time.Sleep(time.Duration(sec) * time.Second)
		}
		fmt.Fprint(w, "a profile")
	}))
	defer srv.Close()
	logs := &warnings{}
	b := &bench{cfg: Config{ProfileDir: t.TempDir(), Logger: slog.New(logs)}, profileName: "latency-100"}
	start := time.Now()
	captured := b.captureCounted(context.Background(), &running{debug: []string{strings.TrimPrefix(srv.URL, "http://")}}, 2*time.Second)
	time.Sleep(time.Until(start.Add(600 * time.Millisecond))) // the counted jobs answered, well within the window
	captured()
	if len(logs.lines) > 0 {
		t.Errorf("a capture whose jobs and collections were on time warned: %q", logs.lines)
	}
}
