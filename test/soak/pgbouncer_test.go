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

	"github.com/toolq/toolq/internal/testenv"
)

// faultPgBouncer kills the pgbouncer in front of Postgres (SIGKILL) and
// starts it again on its port: every client and server connection drops.
const faultPgBouncer = "pgbouncer_sigkill"

// The short soak through PgBouncer: its size, and its faults at these
// fractions of the window, each lasting dur. Postgres stopped and started
// behind PgBouncer (fast, then immediate: a crash) and PgBouncer itself
// killed, twice.
const (
	bouncerJobs   = 150
	bouncerWindow = 15 * time.Second
	bouncerSettle = 45 * time.Second
)

var bouncerFaults = []struct {
	kind string
	at   float64
	dur  time.Duration
}{
	{faultPgBouncer, 0.15, 800 * time.Millisecond},
	{faultPostgres, 0.35, time.Second},
	{faultPgBouncer, 0.55, 300 * time.Millisecond},
	{faultCrash, 0.75, 1200 * time.Millisecond},
}

// TestPgBouncerSoak is a short soak whose consumers reach the ledger
// through PgBouncer in transaction mode (testenv.PgBouncerURLParams in
// their URL), while PgBouncer is killed and restarted and Postgres is
// restarted and crashed behind it: every job is answered, each keyed write
// has one payment, and the checker finds no violation of toolq's promise.
// Its seed is -soak.seed's; its size is its own.
func TestPgBouncerSoak(t *testing.T) {
	seed := *flagSeed
	dir, err := os.MkdirTemp("", "toolq-soak-pgbouncer-")
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
		proxies: map[string]*Proxy{}, linkMu: map[string]*sync.Mutex{}, viaPgBouncer: true}
	r.setup()
	if v, err := testenv.PgBouncerVersion(); err == nil {
		t.Logf("soak: the consumers reach Postgres through %s in transaction mode at %s", v, r.bouncer.Addr())
	}

	sz := size{jobs: bouncerJobs, window: bouncerWindow, settle: bouncerSettle}
	ctx, cancel := context.WithTimeout(context.Background(), sz.window+sz.settle+time.Minute)
	defer cancel()
	evs := plan(seed, sz.jobs)
	t.Logf("soak: seed %d, %d calls, %d publish events, %d faults over %v", seed, sz.jobs, len(evs), len(bouncerFaults), sz.window)

	watchCtx, stopWatch := context.WithCancel(ctx)
	var watch sync.WaitGroup
	watch.Add(1)
	go func() { defer watch.Done(); r.watchdog(watchCtx) }()

	start := time.Now()
	var faults sync.WaitGroup
	for _, bf := range bouncerFaults {
		faults.Add(1)
		go func() {
			defer faults.Done()
			ctxSleep(ctx, time.Until(start.Add(time.Duration(bf.at*float64(sz.window)))))
			if bf.kind != faultPgBouncer {
				r.inject(ctx, fault{kind: bf.kind, dur: bf.dur})
				return
			}
			r.pgMu.Lock()
			defer r.pgMu.Unlock()
			if err := r.bouncer.Restart(bf.dur); err != nil {
				r.mu.Lock()
				r.faultErrs = append(r.faultErrs, fmt.Sprintf("%s: %v", bf.kind, err))
				r.mu.Unlock()
			}
			r.mu.Lock()
			r.faults[bf.kind]++
			r.mu.Unlock()
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
	for _, bf := range bouncerFaults {
		injected = append(injected, bf.kind)
	}
	report += fmt.Sprintf("\nthrough pgbouncer (transaction mode); faults injected in order: %s; %s %d, %s %d, %s %d\n",
		strings.Join(injected, ", "), faultPgBouncer, r.faults[faultPgBouncer], faultPostgres, r.faults[faultPostgres], faultCrash, r.faults[faultCrash])
	os.WriteFile(filepath.Join(dir, "report.txt"), []byte(report), 0o644)
	t.Log("\n" + report)
	if len(r.faultErrs) > 0 {
		t.Errorf("soak: %d fault(s) could not be injected or undone: %s", len(r.faultErrs), strings.Join(r.faultErrs, "; "))
	}
	want := map[string]int{}
	for _, bf := range bouncerFaults {
		want[bf.kind]++
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
		t.Errorf("soak: %d VIOLATION(S) of toolq's promise through PgBouncer with seed %d; the run is kept in %s", len(vs), seed, dir)
	}
}
