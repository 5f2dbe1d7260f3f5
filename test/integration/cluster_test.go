package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/worker"
)

const natsNodeEnv = "TOOLQ_IT_NATS_NODE"

// natsNode is one server of a test cluster, run in its own process (the
// test binary started again with natsNodeEnv set).
type natsNode struct {
	Name        string `json:"name"`
	Port        int    `json:"port"`
	ClusterPort int    `json:"cluster_port"`
	Routes      string `json:"routes"`
	Store       string `json:"store"`
	cmd         *exec.Cmd
}

// natsNodeMain runs the server when the test binary is started as a node.
func natsNodeMain() bool {
	raw := os.Getenv(natsNodeEnv)
	if raw == "" {
		return false
	}
	var n natsNode
	if err := json.Unmarshal([]byte(raw), &n); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	srv, err := server.NewServer(&server.Options{ServerName: n.Name, Host: "127.0.0.1", Port: n.Port, JetStream: true, StoreDir: n.Store,
		Cluster: server.ClusterOpts{Name: "toolq-test", Host: "127.0.0.1", Port: n.ClusterPort},
		Routes:  server.RoutesFromStr(n.Routes), NoLog: true, NoSigs: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	go srv.Start()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	srv.Shutdown()
	return true
}

func (n *natsNode) start(t *testing.T) {
	t.Helper()
	raw, _ := json.Marshal(n)
	n.cmd = exec.Command(os.Args[0], "-test.run=^$")
	n.cmd.Env = append(os.Environ(), natsNodeEnv+"="+string(raw))
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd := n.cmd
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
}

func (n *natsNode) kill() {
	n.cmd.Process.Signal(syscall.SIGKILL)
	n.cmd.Wait()
}

func freePorts(t *testing.T, k int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range k {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// TestClusterNodeKilledMidRun: three nats-server processes in a cluster,
// the streams with three replicas, and a worker connected to all three.
// One node is SIGKILLed while jobs (and retried turns of them) are being
// published and processed, and started again later on its store. Every job
// is answered, and every call makes exactly one payment.
func TestClusterNodeKilledMidRun(t *testing.T) {
	t.Parallel()
	nodes, js := startNATSCluster(t)
	ctx := context.Background()
	streams := jobs.Streams{Replicas: 3}

	logs := &testenv.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	sb, err := sandbox.New(sandbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sb)
	defer srv.Close()
	reg, err := testRegistry(srv.URL, logger, make(chan struct{}))
	if err != nil {
		t.Fatal(err)
	}
	store, err := ledger.Open(ctx, testenv.Postgres(t), "")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var w *worker.Worker
	testenv.Eventually(t, 30*time.Second, "the worker to provision its consumer", func() bool {
		w, err = worker.New(wctx, worker.Config{JS: js, Ledger: store, Tools: reg, Streams: streams, RetryDelay: 100 * time.Millisecond,
			Consumer: worker.Consumer{AckWait: 3 * time.Second}, Logger: logger})
		return err == nil
	})
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()

	client := jobs.NewClient(js)
	c := conv(t)
	const calls = 120
	var victim *natsNode
	var mu sync.Mutex
	var published []*jobs.Job
	publish := func(j *jobs.Job) {
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := client.Publish(pctx, j) // the message id makes a retried publish a no-op
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("publish %s: %v", j.ToolUseID, err)
				return
			}
		}
		mu.Lock()
		published = append(published, j)
		mu.Unlock()
	}
	for i := range calls {
		j := job(c, int64(i), "send_payment", payment(fmt.Sprintf("cluster-%d", i)))
		publish(j)
		if i%3 == 0 { // the retried turn: the same call, a new tool_use_id
			retry := *j
			retry.ToolUseID += "_retry"
			publish(&retry)
		}
		switch i {
		case calls / 3: // the leader of the jobs stream, the hardest node to lose
			victim = leaderOf(t, js, jobs.JobsStream, nodes)
			t.Logf("killing %s, the leader of %s", victim.Name, jobs.JobsStream)
			victim.kill()
		case 2 * calls / 3:
			victim.start(t) // back on its store
		}
		time.Sleep(10 * time.Millisecond)
	}

	actx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	ids := make([]string, len(published))
	for i, j := range published {
		ids[i] = j.ToolUseID
	}
	// One read of the conversation (an Await per call would read it once
	// per call), tried again if a node's loss ends a read.
	got := map[string]*jobs.Result{}
	for len(got) < len(ids) && actx.Err() == nil {
		var res map[string]*jobs.Result
		res, err = client.AwaitAll(actx, published[0].ConversationID, ids)
		for id, r := range res {
			got[id] = r
		}
	}
	var missing []string
	for _, j := range published {
		if r := got[j.ToolUseID]; r == nil || r.Status != jobs.StatusOK {
			missing = append(missing, fmt.Sprintf("%s: %+v", j.ToolUseID, r))
			if len(missing) == 1 { // what the worker logged of the first, by its key
				key, _ := j.Call().Key()
				t.Logf("the worker's lines on %s (key %s):\n%s", j.ToolUseID, key, linesWith(logs.String(), key, j.ToolUseID))
			}
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d jobs without an ok result (%v):\n%s\n%s", len(missing), len(published), err, strings.Join(missing, "\n"), tailOf(logs.String(), 3000))
	}
	if n := len(sb.Payments()); n != calls {
		t.Fatalf("%d payments for %d calls", n, calls)
	}
	byKey := map[string]int{}
	for _, p := range sb.Payments() {
		byKey[p.IdempotencyKey]++
	}
	for k, n := range byKey {
		if n != 1 {
			t.Fatalf("key %s paid %d times", k, n)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("worker: %v", err)
	}
}

// startNATSCluster starts three nats-server processes in a cluster,
// connects to all three, and provisions toolq's streams with three
// replicas.
func startNATSCluster(t *testing.T) ([]*natsNode, jetstream.JetStream) {
	t.Helper()
	ports := freePorts(t, 6)
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[3+i]))
	}
	nodes := make([]*natsNode, 3)
	var urls []string
	for i := range nodes {
		nodes[i] = &natsNode{Name: fmt.Sprintf("n%d", i+1), Port: ports[i], ClusterPort: ports[3+i], Routes: strings.Join(routes, ","), Store: t.TempDir()}
		nodes[i].start(t)
		urls = append(urls, nodes[i].url())
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	testenv.Eventually(t, 60*time.Second, "the cluster to take the replicated streams", func() bool {
		return jobs.ProvisionStreams(context.Background(), js, jobs.Streams{Replicas: 3}) == nil
	})
	return nodes, js
}

func (n *natsNode) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.Port) }

// TestAPublishWhileTheClusterCannotReplicateItSucceedsOnceItCan: an agent
// connected to the leader of TOOLQ_JOBS publishes a job while both other
// servers are stopped (SIGSTOP), so the leader cannot commit it; they are
// continued 3s later. The publish, asked again after its patience while
// the first is still in process (JetStream answers 10158), succeeds once
// the cluster can commit, and the job is in the stream once.
func TestAPublishWhileTheClusterCannotReplicateItSucceedsOnceItCan(t *testing.T) {
	defer jsretry.SetPatience(500 * time.Millisecond)()
	nodes, all := startNATSCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	leader := leaderOf(t, all, jobs.JobsStream, nodes)
	nc, err := nats.Connect(leader.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	client := jobs.NewClient(js)
	if _, err := client.Publish(ctx, job(conv(t), 0, "send_payment", payment("before"))); err != nil {
		t.Fatalf("a publish with every server up: %v", err)
	}

	var followers []*natsNode
	for _, n := range nodes {
		if n != leader {
			followers = append(followers, n)
			n.cmd.Process.Signal(syscall.SIGSTOP)
		}
	}
	for _, n := range followers {
		testenv.Eventually(t, 5*time.Second, n.Name+" to be stopped", func() bool {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.cmd.Process.Pid))
			_, after, _ := strings.Cut(string(stat), ") ")
			return err == nil && strings.HasPrefix(after, "T")
		})
	}
	continued := time.AfterFunc(3*time.Second, func() {
		for _, n := range followers {
			n.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	defer func() {
		if continued.Stop() {
			for _, n := range followers {
				n.cmd.Process.Signal(syscall.SIGCONT)
			}
		}
	}()
	j := job(conv(t), 0, "send_payment", payment("while-stopped"))
	began := time.Now()
	pub, err := client.Publish(ctx, j)
	if err != nil {
		t.Fatalf("the publish while the followers were stopped failed after %v: %v", time.Since(began), err)
	}
	t.Logf("published after %v: seq %d, duplicate %v", time.Since(began).Round(time.Millisecond), pub.Sequence, pub.Duplicate)
	got := 0
	testenv.Eventually(t, 30*time.Second, "the stream to be read", func() bool {
		s, err := all.Stream(ctx, jobs.JobsStream)
		if err != nil {
			return false
		}
		got = 0
		for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				return false
			}
			var in jobs.Job
			if json.Unmarshal(m.Data, &in) == nil && in.ToolUseID == j.ToolUseID && in.ConversationID == j.ConversationID {
				got++
			}
		}
		return true
	})
	if got != 1 {
		t.Fatalf("TOOLQ_JOBS holds the job %d times, want once", got)
	}
}

// leaderOf is the node leading the stream's replicas, once it has one.
func leaderOf(t *testing.T, js jetstream.JetStream, stream string, nodes []*natsNode) *natsNode {
	t.Helper()
	var leader *natsNode
	testenv.Eventually(t, 30*time.Second, "a leader of "+stream, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil || s.CachedInfo().Cluster == nil {
			return false
		}
		for _, n := range nodes {
			if n.Name == s.CachedInfo().Cluster.Leader {
				leader = n
			}
		}
		return leader != nil
	})
	return leader
}

// linesWith is the lines of s that hold any of words.
func linesWith(s string, words ...string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
