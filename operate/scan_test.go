package operate_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/operate"
)

// onFirstPull runs f (once) when the scan's first pull request passes the
// relay, before the server sees it: after the scan's consumer was created
// and counted what it has to read. Nothing is lost.
func onFirstPull(t *testing.T, n *testenv.NATS, f func()) *testenv.LossyJetStream {
	var once sync.Once
	return testenv.LoseJetStreamAnswers(t, n.Connect(), func(api string, _ int) bool {
		if api == "CONSUMER.MSG" {
			once.Do(f)
		}
		return false
	})
}

// TestAListingDoesNotListADeadLetterThatArrivedAfterItBegan: dead
// letters 1, 2 and 3; once the listing's consumer has counted them, another
// operator requeues 2 (Requeue deletes it from the DLQ) and the worker
// dead-letters a new job, 4. The listing must not show 4: it arrived after
// the listing began.
func TestAListingDoesNotListADeadLetterThatArrivedAfterItBegan(t *testing.T) {
	defer jsretry.SetPatience(300 * time.Millisecond)()
	n, direct := withDeadLetters(t, 3)
	js := onFirstPull(t, n, func() {
		deleteMsg(t, direct, jobs.DLQStream, 2)
		publishDeadLetter(t, direct, jobs.DLQMaxDeliver, 4, `{"tool_use_id":"toolu_4"}`)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seqs, err := listedSeqs(ctx, js)
	if err != nil || len(seqs) != 2 || seqs[0] != 1 || seqs[1] != 3 {
		t.Fatalf("listed dead letters %v (%v); want [1 3]: 2 was requeued, 4 arrived after the listing began", seqs, err)
	}
}

// TestAListingEndsWhenADeadLetterIsRequeuedWhileItReads: the same,
// with no new dead letter: the listing must list 1 and 3, at once, not
// wait for a message that is gone and then fail.
func TestAListingEndsWhenADeadLetterIsRequeuedWhileItReads(t *testing.T) {
	defer jsretry.SetPatience(300 * time.Millisecond)()
	n, direct := withDeadLetters(t, 3)
	js := onFirstPull(t, n, func() {
		deleteMsg(t, direct, jobs.DLQStream, 2)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	seqs, err := listedSeqs(ctx, js)
	took := time.Since(began)
	if err != nil || !slices.Equal(seqs, []uint64{1, 3}) {
		t.Fatalf("after %v: listed %v, %v; want 1 and 3", took.Round(time.Millisecond), seqs, err)
	}
}

// TestAReplayDoesNotReplayAJobPublishedAfterItBegan: jobs 1, 2, 3
// are replayed from sequence 1; while the replay reads, job 2 leaves the
// stream (its max age) and an agent publishes job 4. The replay must not
// replay 4, which was published after it began (the agent's own publish
// is running it now; the replay would publish it a second time).
func TestAReplayDoesNotReplayAJobPublishedAfterItBegan(t *testing.T) {
	defer jsretry.SetPatience(300 * time.Millisecond)()
	n, direct := withDeadLetters(t, 0)
	c := jobs.NewClient(direct)
	publish := func(i int) {
		if _, err := c.Publish(context.Background(), &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: "send_payment",
			ToolUseID: "toolu_" + strconv.Itoa(i), Args: json.RawMessage(`{}`)}); err != nil {
			t.Error(err)
		}
	}
	for i := 1; i <= 3; i++ {
		publish(i)
	}
	js := onFirstPull(t, n, func() {
		deleteMsg(t, direct, jobs.JobsStream, 2)
		publish(4)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: 1}, false)
	var seqs []uint64
	for _, r := range got {
		seqs = append(seqs, r.Seq)
	}
	if err != nil || len(seqs) != 2 || seqs[0] != 1 || seqs[1] != 3 {
		t.Fatalf("replayed %v (%v); want [1 3]: job 4 was published after the replay began", seqs, err)
	}
}

// TestAScanEndsWithinTheCallersDeadline: a listing with a deadline of
// 2s whose batches are all lost, and whose consumers' deletions go
// unanswered too (the cluster that lost a node). It must return by its
// deadline (with some slack), not a Fetch's extra second plus a patience
// of cleaning up later. Patience is JetStream's default, 5s.
func TestAScanEndsWithinTheCallersDeadline(t *testing.T) {
	n, _ := withDeadLetters(t, 1)
	js := testenv.LoseJetStreamAnswers(t, n.Connect(), func(api string, _ int) bool {
		return api == "CONSUMER.MSG" || api == "CONSUMER.DELETE"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	began := time.Now()
	_, err := operate.ListDeadLetters(ctx, js, "")
	took := time.Since(began)
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
	if err == nil {
		t.Fatal("listed though every batch was lost")
	}
	if took > 2500*time.Millisecond {
		t.Fatalf("the listing with a 2s deadline returned after %v", took.Round(time.Millisecond))
	}
}

// TestARelayLosesWhatItSaysBesideAnotherRelay: two relays on one server
// (a test that makes one per command): the second loses every answer, so
// a read of a dead letter through it with a 2s deadline fails. Relays on
// one prefix passed each other's requests on with the asker's reply, and
// the later commands lost nothing.
func TestARelayLosesWhatItSaysBesideAnotherRelay(t *testing.T) {
	defer jsretry.SetPatience(300 * time.Millisecond)()
	n, _ := withDeadLetters(t, 1)
	const dead = 1
	first := testenv.LoseJetStreamAnswers(t, n.Connect(), func(_ string, nth int) bool { return nth == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := operate.GetDeadLetter(ctx, first, dead); err != nil {
		t.Fatal(err)
	}
	second := testenv.LoseJetStreamAnswers(t, n.Connect(), func(string, int) bool { return true })
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	began := time.Now()
	if d, err := operate.GetDeadLetter(ctx, second, dead); err == nil {
		t.Fatalf("read dead letter %d after %v through a relay that loses every answer", d.Seq, time.Since(began).Round(time.Millisecond))
	}
}

// TestABatchTheRelayLosesIsDeliveredAndCounted: a pull whose answer the
// relay loses is delivered by the server, which counts it delivered, as
// when a batch is lost on its way (the server delivers a pull's batch only
// to a reply someone listens on).
func TestABatchTheRelayLosesIsDeliveredAndCounted(t *testing.T) {
	n, direct := withDeadLetters(t, 3)
	ctx := context.Background()
	if _, err := direct.CreateOrUpdateConsumer(ctx, jobs.DLQStream, jetstream.ConsumerConfig{Name: "probe", AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	js := testenv.LoseJetStreamAnswers(t, n.Connect(), func(api string, _ int) bool { return api == "CONSUMER.MSG" })
	cons, err := js.Consumer(ctx, jobs.DLQStream, "probe")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for range batch.Messages() {
		t.Fatal("a message of a lost batch came")
	}
	c, _ := direct.Consumer(ctx, jobs.DLQStream, "probe")
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Delivered.Consumer != 3 {
		t.Fatalf("the server delivered %d of the lost batch's 3 messages; the relay lost no delivery", info.Delivered.Consumer)
	}
}

// TestAListingReadsAgainWhatWasLostMidBatch: the first message of the
// listing's first batch is delivered to nobody (a batch cut short on its
// way, as by a reconnect): the rest of the batch comes with the consumer's
// sequence skipping, and the listing reads on from before the loss, listing
// every dead letter once, in order.
func TestAListingReadsAgainWhatWasLostMidBatch(t *testing.T) {
	defer jsretry.SetPatience(300 * time.Millisecond)()
	n, _ := withDeadLetters(t, 3)
	nc := n.Connect()
	if _, err := nc.Subscribe("STOLEN.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	js := testenv.LoseJetStreamAnswers(t, n.Connect(), func(string, int) bool { return false })
	var once sync.Once
	js.OnRequest(func(api string) {
		if !strings.HasPrefix(api, "CONSUMER.MSG.NEXT.") {
			return
		}
		once.Do(func() { // a pull of one message, on the listing's consumer, answered to nobody it knows
			if err := nc.PublishRequest("$JS.API."+api, "STOLEN.1", []byte(`{"batch":1}`)); err != nil {
				t.Error(err)
			}
			if err := nc.Flush(); err != nil {
				t.Error(err)
			}
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seqs, err := listedSeqs(ctx, js)
	if err != nil || !slices.Equal(seqs, []uint64{1, 2, 3}) {
		t.Fatalf("listed %v (%v); want 1, 2 and 3 once each, in order", seqs, err)
	}
	if js.Asked("CONSUMER.CREATE.") != 2 {
		t.Fatalf("%d consumers created, want 2 (the second from before the loss)", js.Asked("CONSUMER.CREATE."))
	}
}

// withStreams starts a server with toolq's streams, the default tenant's
// and those of tenants.
func withStreams(t *testing.T, tenants ...string) (*testenv.NATS, jetstream.JetStream) {
	t.Helper()
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	if err := jobs.ProvisionStreams(context.Background(), js, jobs.Streams{Tenants: tenants}); err != nil {
		t.Fatal(err)
	}
	return n, js
}

// withDeadLetters starts a server with toolq's streams and k dead letters,
// at sequences 1 to k, of the calls toolu_1 to toolu_k.
func withDeadLetters(t *testing.T, k int) (*testenv.NATS, jetstream.JetStream) {
	t.Helper()
	n, direct := withStreams(t)
	for i := range k {
		publishDeadLetter(t, direct, jobs.DLQMaxDeliver, uint64(i+1), `{"tool_use_id":"toolu_`+strconv.Itoa(i+1)+`"}`)
	}
	return n, direct
}

// listedSeqs lists the dead letters, by their sequences.
func listedSeqs(ctx context.Context, js jetstream.JetStream) ([]uint64, error) {
	got, err := operate.ListDeadLetters(ctx, js, "")
	var seqs []uint64
	for _, d := range got {
		seqs = append(seqs, d.Seq)
	}
	return seqs, err
}

// deleteMsg deletes the message at seq of stream, as a requeue deletes a
// dead letter and a stream's max age removes a job.
func deleteMsg(t *testing.T, js jetstream.JetStream, stream string, seq uint64) {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err == nil {
		err = s.DeleteMsg(context.Background(), seq)
	}
	if err != nil {
		t.Error(err)
	}
}
