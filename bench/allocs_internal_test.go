package bench

import (
	"bufio"
	"context"
	"expvar"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
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
			if b.childMallocs < 0 || b.childMallocs > 50 {
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
