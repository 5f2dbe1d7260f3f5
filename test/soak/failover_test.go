package soak

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

var flagHA = flag.Bool("soak.ha", os.Getenv("TOOLQ_SOAK_HA") != "", "run the soak on a pg_auto_failover formation with postgres_failover faults (env TOOLQ_SOAK_HA; make soak-ha)")

// faultFailover kills the primary of the pg_auto_failover formation
// (SIGKILL) and waits for the monitor to promote the secondary: the HA
// soak's fault kind (not in faultKinds, which the soak on one Postgres
// schedules).
const faultFailover = "postgres_failover"

// The HA soak: its size, and its faults at these fractions of the window:
// the primary killed and the secondary promoted, a consumer killed
// meanwhile, and a second failover once the first killed node has
// rejoined as the secondary.
const (
	haJobs   = 200
	haWindow = 40 * time.Second
	haSettle = 60 * time.Second
)

var haFaults = []struct {
	kind string
	at   float64
	dur  time.Duration
}{
	{faultFailover, 0.15, time.Second},
	{faultKill, 0.4, time.Second},
	{faultFailover, 0.6, time.Second},
}

// TestFailoverSoak is a soak whose ledger is a pg_auto_failover formation
// (a monitor, a primary, a synchronous secondary), which the consumers
// reach by its multi-host URL with target_session_attrs=read-write, while
// the primary is killed (postgres_failover) twice and a consumer once:
// every job is answered, each keyed write has one payment, and the checker
// finds no violation of toolq's promise. It runs with -soak.ha (make
// soak-ha); its seed is -soak.seed's, its size its own.
func TestFailoverSoak(t *testing.T) {
	if !*flagHA {
		t.Skip("the HA soak runs with -soak.ha or TOOLQ_SOAK_HA=1 (make soak-ha)")
	}
	seed := *flagSeed
	dir, err := os.MkdirTemp("", "toolq-soak-ha-")
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
		proxies: map[string]*Proxy{}, linkMu: map[string]*sync.Mutex{}, viaFormation: true}
	r.setup()
	t.Logf("soak: the consumers reach the ledger on a pg_auto_failover formation at %s", r.dbURL)

	sz := size{jobs: haJobs, window: haWindow, settle: haSettle}
	ctx, cancel := context.WithTimeout(context.Background(), sz.window+sz.settle+2*time.Minute)
	defer cancel()
	evs := plan(seed, sz.jobs)
	t.Logf("soak: seed %d, %d calls, %d publish events, %d faults over %v", seed, sz.jobs, len(evs), len(haFaults), sz.window)

	watchCtx, stopWatch := context.WithCancel(ctx)
	var watch sync.WaitGroup
	watch.Add(1)
	go func() { defer watch.Done(); r.watchdog(watchCtx) }()

	start := time.Now()
	var faults sync.WaitGroup
	for i, hf := range haFaults {
		faults.Add(1)
		go func() {
			defer faults.Done()
			ctxSleep(ctx, time.Until(start.Add(time.Duration(hf.at*float64(sz.window)))))
			r.inject(ctx, fault{kind: hf.kind, dur: hf.dur, target: i % consumers})
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
	report := r.report(seed, sz, fig, vs, outcomes)
	var injected, recovered []string
	for _, hf := range haFaults {
		injected = append(injected, hf.kind)
	}
	for _, d := range r.failovers {
		recovered = append(recovered, d.Round(100*time.Millisecond).String())
	}
	report += fmt.Sprintf("\non a pg_auto_failover formation; faults injected in order: %s; %s %d (recovered in %s), %s %d\n",
		strings.Join(injected, ", "), faultFailover, r.faults[faultFailover], strings.Join(recovered, ", "), faultKill, r.faults[faultKill])
	os.WriteFile(filepath.Join(dir, "report.txt"), []byte(report), 0o644)
	t.Log("\n" + report)
	if len(r.faultErrs) > 0 {
		t.Errorf("soak: %d fault(s) could not be injected or undone: %s", len(r.faultErrs), strings.Join(r.faultErrs, "; "))
	}
	want := map[string]int{}
	for _, hf := range haFaults {
		want[hf.kind]++
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
		t.Errorf("soak: %d VIOLATION(S) of toolq's promise on the formation with seed %d; the run is kept in %s", len(vs), seed, dir)
	}
}

// failover is the postgres_failover fault: the formation's primary killed
// (SIGKILL to its keeper, Postgres and backends), the wait until the
// promoted secondary takes writes (its time recorded), then, after down,
// the killed node started again and the wait until it is the secondary, so
// that the next failover has one to promote.
func (r *run) failover(ctx context.Context, down time.Duration) error {
	at := time.Now()
	node, err := r.formation.KillPrimary(ctx)
	if err != nil {
		return err
	}
	for {
		// target_session_attrs=read-write: a connection is a primary that
		// takes writes.
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, r.dbURL)
		if err == nil {
			conn.Close(context.Background())
			cancel()
			break
		}
		cancel()
		if ctx.Err() != nil {
			return fmt.Errorf("no primary after the failover: %v\n%s", err, r.formation.State())
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.mu.Lock()
	r.failovers = append(r.failovers, time.Since(at))
	r.mu.Unlock()
	ctxSleep(ctx, down)
	if err := r.formation.Restart(node); err != nil {
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := r.formation.WaitHealthy(hctx); err != nil {
		return fmt.Errorf("%v\n%s", err, r.formation.State())
	}
	return nil
}
