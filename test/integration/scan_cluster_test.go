package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/internal/pull"
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

// TestListingsRightAfterAServerDiedEndWithEveryDeadLetter: the moment one
// of three servers is killed (SIGKILL), six operators list the dead
// letters at once. The cluster can still place a listing's consumer on the
// dead server (it counts as current for a few seconds): a create asked
// again under the same name goes to it again, and waited for the deadline.
// Each listing must list the five dead letters within its deadline.
func TestListingsRightAfterAServerDiedEndWithEveryDeadLetter(t *testing.T) {
	defer jsretry.SetPatience(time.Second)()
	nodes, js := startNATSCluster(t)
	ctx := context.Background()
	for range 5 {
		if _, err := js.Publish(ctx, jobs.DLQSubject(jobs.DLQInvalid), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := nats.Connect(nodes[0].url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	operator, _ := jetstream.New(nc)
	nodes[2].kill()
	var wg sync.WaitGroup
	errs := make(chan string, 6)
	for i := range 6 {
		wg.Go(func() {
			lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			began := time.Now()
			got, err := operate.ListDeadLetters(lctx, operator, "")
			if err != nil || len(got) != 5 {
				errs <- fmt.Sprintf("listing %d: %d dead letters after %v: %v", i, len(got), time.Since(began).Round(time.Millisecond), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestResultReadersRightAfterAServerDiedAreCreated: the same for the
// readers of results agents open (an ordered consumer of TOOLQ_RESULTS):
// six opened the moment a server is killed are each created, and read the
// result published after, within their deadline.
func TestResultReadersRightAfterAServerDiedAreCreated(t *testing.T) {
	defer jsretry.SetPatience(time.Second)()
	nodes, _ := startNATSCluster(t)
	nc, err := nats.Connect(nodes[0].url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	agent, _ := jetstream.New(nc)
	nodes[2].kill()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	readers := make([]jetstream.Consumer, 6)
	var wg sync.WaitGroup
	errs := make(chan string, 6)
	for i := range readers {
		wg.Go(func() {
			began := time.Now()
			var err error
			if readers[i], err = pull.OrderedConsumer(ctx, agent, jobs.ResultsStream, jetstream.OrderedConsumerConfig{}); err != nil {
				errs <- fmt.Sprintf("reader %d: not created after %v: %v", i, time.Since(began).Round(time.Millisecond), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if t.Failed() {
		return
	}
	ack, err := jsretry.Do(ctx, func(ctx context.Context) (*jetstream.PubAck, error) {
		return agent.Publish(ctx, jobs.ResultSubject("after"), []byte(`{}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range readers { // read as the client reads, until its deadline
		iter, err := r.Messages()
		if err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
		it := pull.New(iter, nc)
		stop := context.AfterFunc(ctx, it.Stop)
		m, err := it.Next()
		stop()
		it.Stop()
		if err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
		if meta, _ := m.Metadata(); meta.Sequence.Stream != ack.Sequence {
			t.Fatalf("reader %d read %d, want the result at %d", i, meta.Sequence.Stream, ack.Sequence)
		}
	}
}
