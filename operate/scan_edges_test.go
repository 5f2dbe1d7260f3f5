package operate_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/jsretry"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/operate"
)

// TestAListingReadsADeadLetterLargerThanItsBatchBytes: a dead letter of
// 17 MB was stored by a server that allowed payloads of 24 MB; the
// operator's server (the same store, now with the default 1 MB limit, as
// after a configuration change or through another server of the cluster)
// bounds a listing's batch by 16 MB. The server answers a pull whose
// first message is over its bytes with 409 Message Size Exceeds MaxBytes,
// which the client takes for an empty batch: the listing must still list
// the three dead letters, not stop at the large one saying no messages came.
func TestAListingReadsADeadLetterLargerThanItsBatchBytes(t *testing.T) {
	// Patience enough for 17 MB to come under -race on a busy machine: the
	// test is of the 409, not of a lost answer.
	defer jsretry.SetPatience(5 * time.Second)()
	big := testenv.StartNATS(t, func(o *server.Options) { o.MaxPayload, o.MaxPending = 24<<20, 128<<20 })
	direct, _ := jetstream.New(big.Connect())
	if err := jobs.ProvisionStreams(context.Background(), direct, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	publishDeadLetter(t, direct, jobs.DLQMaxDeliver, 1, `{"tool_use_id":"toolu_1"}`)
	publishDeadLetter(t, direct, jobs.DLQMaxDeliver, 2, `{"tool_use_id":"toolu_2","pad":"`+strings.Repeat("x", 17<<20)+`"}`)
	publishDeadLetter(t, direct, jobs.DLQMaxDeliver, 3, `{"tool_use_id":"toolu_3"}`)
	big.Shutdown()
	n := testenv.StartNATS(t, func(o *server.Options) { o.StoreDir = big.StoreDir })
	js, _ := jetstream.New(n.Connect())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seqs, err := listedSeqs(ctx, js)
	if err != nil || !slices.Equal(seqs, []uint64{1, 2, 3}) {
		t.Fatalf("listed %v (%v); want 1, 2 and 3", seqs, err)
	}
}

// answerLost is a JetStream whose publishes are stored but whose PubAcks
// never come (the server that stored them lost its connection to the
// asker): each waits for its context.
type answerLost struct{ jetstream.JetStream }

func (a answerLost) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if _, err := a.JetStream.PublishMsg(context.WithoutCancel(ctx), m, opts...); err != nil {
		return nil, err
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestAReplayWhosePublishIsUnansweredSaysItMayHaveBeenPublished: job 1
// is replayed; its publish is stored but no PubAck comes before the
// replay's deadline. The replay returns no job and an error; the operator,
// told to replay the range again from after the last job shown, publishes
// job 1 a second time. The error must say that job 1 may have been
// published.
func TestAReplayWhosePublishIsUnansweredSaysItMayHaveBeenPublished(t *testing.T) {
	defer jsretry.SetPatience(300 * time.Millisecond)()
	_, direct := withStreams(t)
	if _, err := jobs.NewClient(direct).Publish(context.Background(), &jobs.Job{ConversationID: "c", Tool: "send_payment",
		ToolUseID: "toolu_1", Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	got, err := operate.Replay(ctx, answerLost{direct}, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: 1}, false)
	s, _ := direct.Stream(context.Background(), jobs.JobsStream)
	stored := s.CachedInfo().State.Msgs
	t.Logf("replayed %d job(s), error %v; the stream holds %d message(s)", len(got), err, stored)
	if stored != 2 {
		t.Fatalf("the stream holds %d messages, want 2 (job 1 and its replay)", stored)
	}
	if err == nil || !strings.Contains(err.Error(), "may have been published") {
		t.Fatalf("replay of job 1 was published, and the replay answered %d job(s) and %v: nothing says it may have been", len(got), err)
	}
}

// TestAListingAsksTheLeaderNotAReplicaOrMirror: TOOLQ_DLQ allows direct
// gets and has a mirror that answers them (MirrorDirect, a read replica
// in another region). Dead letters: invalid 1 and 2, max_deliver 3; the
// mirror has copied all three, then 2 is requeued (deleted from TOOLQ_DLQ;
// a mirror keeps what its origin deletes). A listing of the invalid ones
// reads 1, its consumer counts 0 left, and it asks whether an invalid one
// is left after 1: a direct get, answered by the origin or by the mirror
// (which still has 2, before the listing's bound), at random. Each answer
// of the mirror costs the listing a fetch that waits its patience for
// nothing, and three fail it ("more left") though it read every dead
// letter. The check must be asked of the stream's leader (STREAM.MSG.GET).
func TestAListingAsksTheLeaderNotAReplicaOrMirror(t *testing.T) {
	defer jsretry.SetPatience(300 * time.Millisecond)()
	n, direct := withDeadLetters(t, 0)
	ctx := context.Background()
	publishDeadLetter(t, direct, jobs.DLQInvalid, 1, `{"tool_use_id":"toolu_1"}`)
	publishDeadLetter(t, direct, jobs.DLQInvalid, 2, `{"tool_use_id":"toolu_2"}`)
	publishDeadLetter(t, direct, jobs.DLQMaxDeliver, 3, `{"tool_use_id":"toolu_3"}`)
	s, err := direct.Stream(ctx, jobs.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowDirect = true
	if _, err := direct.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	m, err := direct.CreateStream(ctx, jetstream.StreamConfig{Name: "DLQ_MIRROR", Mirror: &jetstream.StreamSource{Name: jobs.DLQStream},
		MirrorDirect: true, AllowDirect: true})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the mirror to copy the dead letters", func() bool {
		info, err := m.Info(ctx)
		return err == nil && info.State.Msgs == 3
	})
	if err := s.DeleteMsg(ctx, 2); err != nil {
		t.Fatal(err)
	}
	js := testenv.LoseJetStreamAnswers(t, n.Connect(), func(string, int) bool { return false })
	fails, slow := 0, 0
	for range 10 {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		began := time.Now()
		got, err := operate.ListDeadLetters(lctx, js, jobs.DLQInvalid)
		took := time.Since(began)
		cancel()
		if err != nil || len(got) != 1 {
			fails++
			t.Logf("listed %d after %v: %v", len(got), took.Round(time.Millisecond), err)
		} else if took > 250*time.Millisecond {
			slow++
		}
	}
	t.Logf("10 listings: %d failed, %d waited a patience or more; %d direct gets, %d leader gets",
		fails, slow, js.Asked("DIRECT.GET."), js.Asked("STREAM.MSG.GET."))
	if fails > 0 || js.Asked("DIRECT.GET.") > 0 {
		t.Fatalf("%d of 10 listings failed; %d checks were direct gets, which a mirror or a replica catching up answers", fails, js.Asked("DIRECT.GET."))
	}
}
