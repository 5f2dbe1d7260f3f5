package soak

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
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

var haFaults = []placedFault{
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
	r := placedRun(t, "toolq-soak-ha-", seed, func(r *run) { r.viaFormation = true })
	t.Logf("soak: the consumers reach the ledger on a pg_auto_failover formation at %s", r.dbURL)
	sz := size{jobs: haJobs, window: haWindow, settle: haSettle}
	r.soakPlaced(seed, sz, sz.window+sz.settle+2*time.Minute, haFaults,
		func(ctx context.Context, i int, f placedFault) {
			r.inject(ctx, fault{kind: f.kind, dur: f.dur, target: i % consumers})
		},
		func(injected []string) string {
			var recovered []string
			for _, d := range r.failovers {
				recovered = append(recovered, d.Round(100*time.Millisecond).String())
			}
			return summaryOf("on a pg_auto_failover formation", injected, fmt.Sprintf("%s %d (recovered in %s), %s %d",
				faultFailover, r.faults[faultFailover], strings.Join(recovered, ", "), faultKill, r.faults[faultKill]))
		}, "on the formation")
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
