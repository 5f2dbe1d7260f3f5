package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// TestResultsReaderWhoseConsumerNodeDiesMissesNoResult: an agent's Results
// reader, connected to one node of a three-node cluster, whose consumer
// (an R1 memory consumer) lives on another node. That node is SIGKILLed
// before any result came; results expected before their jobs were published
// are published right after, while the stream keeps its quorum. The reader
// must hand every one of them to the agent.
func TestResultsReaderWhoseConsumerNodeDiesMissesNoResult(t *testing.T) {
	t.Parallel()
	ports := freePorts(t, 6)
	var routes, urls []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[3+i]))
	}
	nodes := make([]*natsNode, 3)
	for i := range nodes {
		nodes[i] = &natsNode{Name: fmt.Sprintf("n%d", i+1), Port: ports[i], ClusterPort: ports[3+i], Routes: strings.Join(routes, ","), Store: t.TempDir()}
		nodes[i].start(t)
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	ctx := context.Background()
	opts := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond), nats.RetryOnFailedConnect(true)}
	pubNC, err := nats.Connect(strings.Join(urls, ","), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer pubNC.Close()
	pubJS, _ := jetstream.New(pubNC)
	testenv.Eventually(t, 60*time.Second, "the cluster to take the replicated streams", func() bool {
		return jobs.ProvisionStreams(ctx, pubJS, jobs.Streams{Replicas: 3}) == nil
	})
	results, err := pubJS.Stream(ctx, jobs.ResultsStream)
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() map[string]string { // name → the node it lives on
		out := map[string]string{}
		l := results.ListConsumers(ctx)
		for ci := range l.Info() {
			if ci.Cluster != nil {
				out[ci.Name] = ci.Cluster.Leader
			}
		}
		return out
	}

	// The agent is connected to n1; its reader's consumer must live elsewhere.
	agentNC, err := nats.Connect(urls[0], opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer agentNC.Close()
	agentJS, _ := jetstream.New(agentNC)
	client := jobs.NewClient(agentJS)
	var rs *jobs.Results
	var host string
	for try := 0; host == "" || host == "n1"; try++ {
		if try == 10 {
			t.Fatal("the reader's consumer was placed on n1 ten times")
		}
		if rs != nil {
			rs.Close()
		}
		before := consumers()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rs, err = client.Results(cctx, "")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for name, node := range consumers() {
			if _, ok := before[name]; !ok {
				host = node
			}
		}
	}
	defer rs.Close()
	victim := nodes[slices.IndexFunc(nodes, func(n *natsNode) bool { return n.Name == host })]
	if leaderOf(t, pubJS, jobs.ResultsStream, nodes) == victim { // keep the stream writable at once
		pubNC.Request("$JS.API.STREAM.LEADER.STEPDOWN."+jobs.ResultsStream, nil, 5*time.Second)
		testenv.Eventually(t, 30*time.Second, "another leader of the results stream", func() bool {
			info, err := results.Info(ctx)
			return err == nil && info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != host
		})
	}

	c := conv(t)
	const n = 5
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("toolu_reset_%d", i)
	}
	aw := rs.ExpectIn(c, ids...) // before the jobs are published, as Results says
	t.Logf("killing %s, where the reader's consumer lives (the agent is on n1)", host)
	killed := time.Now()
	victim.kill()
	for i, id := range ids {
		j := job(c, int64(i), "send_payment", payment(id))
		j.ToolUseID = id
		body, _ := json.Marshal(jobs.NewResult(j, "k-"+id, jobs.StatusOK))
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := pubJS.Publish(pctx, jobs.ResultSubject(c), body, jetstream.WithMsgID("r-"+id))
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("publish the result of %s: %v", id, err)
			}
		}
	}
	t.Logf("%d results published %v after the kill", n, time.Since(killed).Round(time.Millisecond))

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got, err := aw.Wait(wctx)
	var missing []string
	for i, r := range got {
		if r == nil {
			missing = append(missing, ids[i])
		}
	}
	if len(missing) > 0 {
		// The reader lives on: a result published now comes.
		late := "toolu_reset_late"
		aw2 := rs.ExpectIn(c, late)
		j := job(c, 99, "send_payment", payment(late))
		j.ToolUseID = late
		body, _ := json.Marshal(jobs.NewResult(j, "k-"+late, jobs.StatusOK))
		if _, err := pubJS.Publish(ctx, jobs.ResultSubject(c), body); err != nil {
			t.Fatal(err)
		}
		lctx, lcancel := context.WithTimeout(ctx, 15*time.Second)
		defer lcancel()
		lateGot, lateErr := aw2.Wait(lctx)
		t.Fatalf("%d of %d results never reached the reader (%v): %v; its consumers now: %v; a result published afterwards: %v %v",
			len(missing), n, err, missing, consumers(), lateGot[0] != nil, lateErr)
	}
}
