package soak

import (
	"context"
	"fmt"
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

var bouncerFaults = []placedFault{
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
	r := placedRun(t, "toolq-soak-pgbouncer-", seed, func(r *run) { r.viaPgBouncer = true })
	if v, err := testenv.PgBouncerVersion(); err == nil {
		t.Logf("soak: the consumers reach Postgres through %s in transaction mode at %s", v, r.bouncer.Addr())
	}
	sz := size{jobs: bouncerJobs, window: bouncerWindow, settle: bouncerSettle}
	r.soakPlaced(seed, sz, sz.window+sz.settle+time.Minute, bouncerFaults,
		func(ctx context.Context, _ int, f placedFault) {
			if f.kind != faultPgBouncer {
				r.inject(ctx, fault{kind: f.kind, dur: f.dur})
				return
			}
			r.pgMu.Lock()
			defer r.pgMu.Unlock()
			if err := r.bouncer.Restart(f.dur); err != nil {
				r.mu.Lock()
				r.faultErrs = append(r.faultErrs, fmt.Sprintf("%s: %v", f.kind, err))
				r.mu.Unlock()
			}
			r.mu.Lock()
			r.faults[f.kind]++
			r.mu.Unlock()
		},
		func(injected []string) string {
			return summaryOf("through pgbouncer (transaction mode)", injected, fmt.Sprintf("%s %d, %s %d, %s %d",
				faultPgBouncer, r.faults[faultPgBouncer], faultPostgres, r.faults[faultPostgres], faultCrash, r.faults[faultCrash]))
		}, "through PgBouncer")
}
