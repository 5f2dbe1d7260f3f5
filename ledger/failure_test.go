package ledger_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// The helper process: when TOOLQ_LEDGER_HELPER is set, the test binary claims
// one key, says so, and waits to be killed.
const helperEnv = "TOOLQ_LEDGER_HELPER"

func helperMain() bool {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		return false
	}
	parts := strings.Split(spec, "|")
	url, dir, key := parts[0], parts[1], parts[2]
	ctx := context.Background()
	s, err := ledger.Open(ctx, url, dir)
	if err == nil {
		err = s.Migrate(ctx)
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	c := newClaim(4 * time.Second)
	c.Key, c.Owner = key, fmt.Sprintf("helper-%d", os.Getpid())
	res, err := s.Claim(ctx, []ledger.Claim{c})
	if err != nil || !res[0].Claimed {
		fmt.Println("error: claim failed:", err)
		os.Exit(2)
	}
	fmt.Println("claimed")
	select {} // the tool "runs" until SIGKILL
}

// TestKilledHolderIsTakenOverAfterItsLease: a real process claims a key and is
// killed with SIGKILL before completing it. The in-flight row stays; nobody
// can take it over while its lease runs; once the lease has expired another
// process takes it over with the next attempt.
func TestKilledHolderIsTakenOverAfterItsLease(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url, dir := "", t.TempDir()
			if backend == "postgres" {
				url = testenv.Postgres(t)
			}
			key := newClaim(time.Second).Key
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"="+url+"|"+dir+"|"+key)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, _ := bufio.NewReader(stdout).ReadString('\n')
			if strings.TrimSpace(line) != "claimed" {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("helper said %q", line)
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()

			s, err := ledger.Open(ctx, url, dir)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			row := mustGet(t, s, key)
			if row.State != ledger.InFlight || row.Attempt != 1 || !strings.HasPrefix(row.Owner, "helper-") {
				t.Fatalf("row left by the killed holder: %+v", row)
			}
			// Not before the lease has expired (4 s from the claim)…
			if row.LeaseExpired() {
				t.Fatalf("the lease expired before the takeover could be tried: %+v", row)
			}
			_, err = s.Takeover(ctx, row.Fence(), "survivor", newToken(), time.Minute)
			isErr(t, err, ledger.ErrLeaseHeld)
			if res, err := s.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: row.ConversationID, TurnIndex: row.TurnIndex,
				Tool: row.Tool, Ordinal: row.Ordinal, ArgsDigest: row.ArgsDigest, ToolUseID: "toolu_survivor", Owner: "survivor", Lease: time.Minute}}); err != nil || res[0].Claimed {
				t.Fatalf("a claim while the dead holder's lease runs: %+v %v", res, err)
			}
			// …and once it has.
			waitExpired(t, s, key)
			taken, err := s.Takeover(ctx, row.Fence(), "survivor", newToken(), time.Minute)
			if err != nil || taken.Attempt != 2 || taken.Owner != "survivor" {
				t.Fatalf("takeover: %+v %v", taken, err)
			}
		})
	}
}

// TestPostgresDownAndBack: with the server stopped, calls fail with an error
// that wraps ErrUnavailable (not a hang until the deadline, not a panic); when
// it is back, the same Store works again.
func TestPostgresDownAndBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := testenv.OwnCluster(t)
	s, err := ledger.OpenPostgres(ctx, cluster.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, newClaim(time.Minute))
	if err := cluster.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // a pooled connection dies first, then new ones are refused
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := s.Claim(cctx, []ledger.Claim{newClaim(time.Minute)})
		cancel()
		if !errors.Is(err, ledger.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d with Postgres down: %v", i, err)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Fatalf("error is not one line: %q", err)
		}
	}
	_, err = s.Get(ctx, "k")
	isErr(t, err, ledger.ErrUnavailable)
	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	var claimErr error
	defer func() {
		if claimErr != nil {
			t.Logf("last claim: %v", claimErr)
		}
	}()
	testenv.Eventually(t, 30*time.Second, "the store to recover", func() bool {
		_, claimErr = s.Claim(ctx, []ledger.Claim{newClaim(time.Minute)})
		return claimErr == nil
	})
}

// TestSQLiteUnreachable: a ledger path that cannot be created gives a clear
// error at Open.
func TestSQLiteUnreachable(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ledger.OpenSQLite(context.Background(), filepath.Join(file, "ledger.db"))
	if err == nil || !strings.HasPrefix(err.Error(), "ledger:") {
		t.Fatalf("err = %v", err)
	}
}
