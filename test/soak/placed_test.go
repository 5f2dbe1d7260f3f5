package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// placedFault is a fault of a soak on a setup of its own (PgBouncer, a
// pg_auto_failover formation), at a fraction of the load's window.
type placedFault struct {
	kind string
	at   float64
	dur  time.Duration
}

// placedRun makes the run of such a soak in a directory of its own, kept
// when the test fails or -soak.keep asks; more sets the run's setup.
func placedRun(t *testing.T, prefix string, seed uint64, more func(*run)) *run {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
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
	r := &run{t: t, executor: "http", dir: dir, published: map[string]*Published{}, routes: map[string]int{}, faults: map[string]int{},
		proxies: map[string]*Proxy{}, linkMu: map[string]*sync.Mutex{}}
	more(r)
	r.setup()
	return r
}

// soakPlaced drives the load of sz with the faults placed in its window,
// each injected by inject (i its index), waits for every job to settle,
// checks what happened, reports it (with the line summary gives), and
// fails the test on a fault not injected or not undone, a job neither
// answered nor dead-lettered, a job lost or a violation of the promise.
// where names the setup in that last failure.
func (r *run) soakPlaced(seed uint64, sz size, timeout time.Duration, placed []placedFault,
	inject func(ctx context.Context, i int, f placedFault), summary func(injected []string) string, where string) {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	evs := plan(seed, sz.jobs)
	t.Logf("soak: seed %d, %d calls, %d publish events, %d faults over %v", seed, sz.jobs, len(evs), len(placed), sz.window)

	watchCtx, stopWatch := context.WithCancel(ctx)
	var watch sync.WaitGroup
	watch.Add(1)
	go func() { defer watch.Done(); r.watchdog(watchCtx) }()

	start := time.Now()
	var faults sync.WaitGroup
	for i, f := range placed {
		faults.Add(1)
		go func() {
			defer faults.Done()
			ctxSleep(ctx, time.Until(start.Add(time.Duration(f.at*float64(sz.window)))))
			inject(ctx, i, f)
		}()
	}
	r.drive(ctx, evs, start, sz.window*9/10)
	faults.Wait()
	t.Logf("soak: load and faults done after %v; waiting for every job to settle", time.Since(start).Round(time.Millisecond))

	pending := r.awaitSettled(ctx, time.Now().Add(sz.settle))
	t.Logf("soak: settled after %v (%d tool_use_id(s) unsettled)", time.Since(start).Round(time.Millisecond), len(pending))
	stopWatch()
	watch.Wait()
	outcomes := r.stopConsumers()

	obs := r.observe(ctx)
	fig, vs := Check(obs)
	// The report's fault counts are the soak's schedule's kinds; this run's
	// own are on its last line.
	report := r.report(seed, sz, fig, vs, outcomes)
	var injected []string
	want := map[string]int{}
	for _, f := range placed {
		injected = append(injected, f.kind)
		want[f.kind]++
	}
	report += "\n" + summary(injected) + "\n"
	os.WriteFile(filepath.Join(r.dir, "report.txt"), []byte(report), 0o644)
	t.Log("\n" + report)
	if len(r.faultErrs) > 0 {
		t.Errorf("soak: %d fault(s) could not be injected or undone: %s", len(r.faultErrs), strings.Join(r.faultErrs, "; "))
	}
	for kind, n := range want {
		if r.faults[kind] != n {
			t.Errorf("soak: %d of %d %s faults injected", r.faults[kind], n, kind)
		}
	}
	if len(pending) > 0 {
		t.Errorf("soak: %d tool_use_id(s) neither answered nor dead-lettered: %v", len(pending), pending[:min(10, len(pending))])
	}
	if fig.Lost > 0 {
		t.Errorf("soak: %d job(s) lost", fig.Lost)
	}
	if len(vs) > 0 {
		t.Errorf("soak: %d VIOLATION(S) of toolq's promise %s with seed %d; the run is kept in %s", len(vs), where, seed, r.dir)
	}
}

// summaryOf is a report's last line: where it ran, and the faults.
func summaryOf(where string, injected []string, counts string) string {
	return fmt.Sprintf("%s; faults injected in order: %s; %s", where, strings.Join(injected, ", "), counts)
}
