package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestFormationFailsOver: the formation starts as a primary and a
// synchronous secondary (the primary's synchronous_standby_names names it); its multi-host URL reaches the primary; once the
// primary is killed the URL reaches the promoted secondary, which takes
// writes, and the killed node rejoins as a secondary.
func TestFormationFailsOver(t *testing.T) {
	f := StartFormation(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	t.Log("\n" + f.State())
	write := func() error {
		conn, err := pgx.Connect(ctx, f.URL())
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS t (i int); INSERT INTO t VALUES (1)")
		return err
	}
	if err := write(); err != nil {
		t.Fatal(err)
	}
	// The secondary is synchronous: a commit that waits waits for it.
	conn, err := pgx.Connect(ctx, f.URL())
	if err != nil {
		t.Fatal(err)
	}
	var sync string
	err = conn.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&sync)
	conn.Close(context.Background())
	if err != nil || sync == "" {
		t.Fatalf("synchronous_standby_names %q (%v): the secondary is not synchronous", sync, err)
	}
	t.Logf("synchronous_standby_names = %s", sync)
	killed, err := f.KillPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for write() != nil {
		if ctx.Err() != nil {
			t.Fatalf("no write after the failover:\n%s\n%s", f.State(), f.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("writable again after %v", time.Since(start).Round(time.Millisecond))
	if p, err := f.Primary(ctx); err != nil || p == killed {
		t.Fatalf("primary %d after killing %d: %v", p, killed, err)
	}
	if err := f.Restart(killed); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitHealthy(ctx); err != nil {
		t.Fatalf("%v\n%s", err, f.State())
	}
	t.Log("\n" + f.State())
}
