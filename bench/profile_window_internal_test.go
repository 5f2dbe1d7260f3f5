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
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
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
	mux := http.NewServeMux() // as the consumer's --debug-pprof
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	dir := t.TempDir()
	b := &bench{cfg: Config{ProfileDir: dir, Logger: slog.New(slog.DiscardHandler)}, profileName: "latency-100"}
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	allocate(32) // the warm-up's, not yet collected when the counted jobs begin
	captured := b.captureCounted(context.Background(), &running{debug: []string{strings.TrimPrefix(srv.URL, "http://")}}, countedWindow(100, 100))
	time.Sleep(300 * time.Millisecond) // the process has been asked
	runtime.GC()                       // its one collection in the window
	allocate(64)                       // the counted jobs'
	captured()
	got := readProfile(t, filepath.Join(dir, "latency-100.allocs")).totals["alloc_space"]
	if got < 56<<20 || got > 80<<20 {
		t.Errorf("latency-100.allocs: %.1f MiB allocated, want the window's 64 MiB (not the 32 MiB allocated before it)", float64(got)/(1<<20))
	}
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
// allocations (a fresh job allocates about 17 KiB; at least 1 KB each).
func TestALatencyRunsAllocationProfileHoldsItsCountedJobs(t *testing.T) {
	t.Parallel()
	bin := buildConsumer(t)
	b := profiledLatencySetup(t, Config{WarmUp: time.Second, Settle: -1, Concurrency: 8})
	b.profileName = "latency-100"
	if _, err := b.latencyRun(context.Background(), 100, &build{bin: bin, pay: "pay"}, nil, 300); err != nil {
		t.Fatal(err)
	}
	p := readProfile(t, filepath.Join(b.cfg.ProfileDir, "latency-100.allocs"))
	if got := p.totals["alloc_space"]; got < 300*1000 {
		t.Errorf("latency-100.allocs: %d bytes allocated over %s (%v), want those of 300 jobs, 1 KB each at least",
			got, time.Duration(p.durationNanos), p.totals)
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
	said := slices.ContainsFunc(logs.lines, func(l string) bool { return strings.Contains(l, "latency-20") })
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
