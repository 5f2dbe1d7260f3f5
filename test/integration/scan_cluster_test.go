package integration

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/operate"
)

// TestAListingOnANodeThatIsCatchingUpListsEveryDeadLetter: TOOLQ_DLQ has
// three replicas; one of its followers is shut down while the worker
// dead-letters 1500 large jobs (max_deliver) and then 5 invalid ones, and
// started again. While it catches up, an operator lists the invalid dead
// letters, again and again: each listing began after the five were stored,
// so each must list the five (or fail). The listing's consumer is placed on
// any of the three servers, and one on the server catching up counts what
// that server has stored so far.
func TestAListingOnANodeThatIsCatchingUpListsEveryDeadLetter(t *testing.T) {
	nodes, js := startNATSCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	leader := leaderOf(t, js, jobs.DLQStream, nodes)
	var follower *natsNode
	for _, n := range nodes {
		if n != leader {
			follower = n
		}
	}
	follower.cmd.Process.Signal(syscall.SIGTERM) // a clean shutdown: the others know it is gone
	follower.cmd.Wait()
	pad := []byte(strings.Repeat("x", 32<<10))
	for i := range 1500 {
		if _, err := js.Publish(ctx, jobs.DLQSubject(jobs.DLQMaxDeliver), pad); err != nil {
			t.Fatalf("dead letter %d: %v", i, err)
		}
	}
	for range 5 {
		if _, err := js.Publish(ctx, jobs.DLQSubject(jobs.DLQInvalid), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	follower.start(t)
	lists, fails := 0, 0
	started := time.Now()
	for time.Since(started) < 8*time.Second { // it caught up within 3s in every run seen
		lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
		got, err := operate.ListDeadLetters(lctx, js, jobs.DLQInvalid)
		lcancel()
		if err != nil {
			fails++
			continue
		}
		lists++
		if len(got) != 5 {
			s, _ := js.Stream(ctx, jobs.DLQStream)
			t.Fatalf("listing %d, %v after the follower started again, listed %d of the 5 invalid dead letters, without an error (stream: %+v)",
				lists, time.Since(started).Round(time.Millisecond), len(got), s.CachedInfo().State)
		}
	}
	if lists == 0 {
		t.Fatalf("no listing completed while the follower caught up (%d failed)", fails)
	}
	t.Logf("%d listings, all complete; %d failed", lists, fails)
}
