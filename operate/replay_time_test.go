package operate_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/operate"
)

// steppedClock is a JetStream whose messages carry the timestamps a server
// whose clock stepped would have given them: the stored timestamp of each
// stream sequence is shifted by shift(seq). Everything else is the real
// server's.
type steppedClock struct {
	jetstream.JetStream
	shift func(seq uint64) time.Duration
}

func (s steppedClock) CreateOrUpdateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := s.JetStream.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return c, err
	}
	return steppedConsumer{c, s.shift}, nil
}

type steppedConsumer struct {
	jetstream.Consumer
	shift func(seq uint64) time.Duration
}

func (c steppedConsumer) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := c.Consumer.Fetch(n, opts...)
	if err != nil {
		return b, err
	}
	out := make(chan jetstream.Msg)
	go func() {
		defer close(out)
		for m := range b.Messages() {
			out <- steppedMsg{m, c.shift}
		}
	}()
	return steppedBatch{b, out}, nil
}

type steppedBatch struct {
	jetstream.MessageBatch
	msgs chan jetstream.Msg
}

func (b steppedBatch) Messages() <-chan jetstream.Msg { return b.msgs }

type steppedMsg struct {
	jetstream.Msg
	shift func(seq uint64) time.Duration
}

func (m steppedMsg) Metadata() (*jetstream.MsgMetadata, error) {
	meta, err := m.Msg.Metadata()
	if err != nil {
		return meta, err
	}
	cp := *meta
	cp.Timestamp = cp.Timestamp.Add(m.shift(cp.Sequence.Stream))
	return &cp, nil
}

// publishJob publishes the send_payment call toolu_<i> of turn i.
func publishJob(t *testing.T, js jetstream.JetStream, i int) {
	t.Helper()
	if _, err := jobs.NewClient(js).Publish(context.Background(), &jobs.Job{ConversationID: "c", TurnIndex: int64(i), Tool: "send_payment",
		ToolUseID: "toolu_" + strconv.Itoa(i), Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
}

// replayedSeqs is the sequences of the jobs a replay listed.
func replayedSeqs(got []operate.Replayed, err error) ([]uint64, error) {
	var seqs []uint64
	for _, g := range got {
		seqs = append(seqs, g.Seq)
	}
	return seqs, err
}

// TestATimeRangeReplayReadsPastAJobStampedAfterUntil: JetStream stamps a
// message with its (leader) server's clock, which can step backwards (an
// NTP correction of a clock that ran fast; a leader change to a node whose
// clock is behind). Jobs 1-3 were stamped an hour ahead, jobs 4-5
// correctly, ten minutes ago. A replay of --since 1h --until 5m replays
// jobs 4 and 5, stamped in the range, though jobs stamped after --until
// come before them.
func TestATimeRangeReplayReadsPastAJobStampedAfterUntil(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, real := withStreams(t)
	for i := range 5 {
		publishJob(t, real, i)
	}
	js := steppedClock{real, func(seq uint64) time.Duration {
		if seq <= 3 {
			return time.Hour // the clock ran an hour fast
		}
		return -10 * time.Minute // stepped back: these are stamped ten minutes ago
	}}
	now := time.Now()
	r := operate.ReplayRange{Subject: jobs.JobsSubjects, Since: now.Add(-time.Hour), Until: now.Add(-5 * time.Minute)}
	seqs, err := replayedSeqs(operate.Replay(ctx, js, r, true))
	if err != nil || len(seqs) != 2 {
		t.Fatalf("replay --since 1h --until 5m: sequences %v, err %v; want [4 5], the jobs stamped in the range", seqs, err)
	}
}

// TestATimeRangeReplaySkipsAJobStampedBeforeSince: the server finds where
// a time range starts by searching the stream as if its timestamps grew
// with the sequence; after a clock stepped back, the job it starts at can
// be stamped before since. Job 1, stamped two hours ago though stored
// after the start of --since 1h, is not replayed.
func TestATimeRangeReplaySkipsAJobStampedBeforeSince(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, real := withStreams(t)
	for i := range 3 {
		publishJob(t, real, i)
	}
	js := steppedClock{real, func(seq uint64) time.Duration {
		if seq == 1 {
			return -2 * time.Hour
		}
		return 0
	}}
	seqs, err := replayedSeqs(operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, Since: time.Now().Add(-time.Hour)}, true))
	if err != nil || len(seqs) != 2 || seqs[0] != 2 {
		t.Fatalf("replay --since 1h: sequences %v, err %v; want [2 3], the jobs stamped in the range", seqs, err)
	}
}

// TestAReplayStopsAtUntil: the jobs stamped after --until are not
// replayed.
func TestAReplayStopsAtUntil(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := withStreams(t)
	since := time.Now().Add(-time.Minute)
	publishJob(t, js, 0)
	publishJob(t, js, 1)
	time.Sleep(50 * time.Millisecond)
	until := time.Now()
	time.Sleep(50 * time.Millisecond)
	publishJob(t, js, 2)
	got, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, Since: since, Until: until}, true)
	if err != nil || len(got) != 2 || got[1].Seq != 2 {
		t.Fatalf("replay up to until: %+v %v; want jobs 1 and 2", got, err)
	}
}

// TestAnInvertedTimeRangeIsRefusedLikeAnInvertedSequenceRange: a time
// range whose until is before its since (an operator's "--since 1h --until
// 2h", meaning between one and two hours ago) is an error before anything
// is read, as a sequence range whose end is before its start is; it
// replayed nothing, reported as a replay of 0 jobs.
func TestAnInvertedTimeRangeIsRefusedLikeAnInvertedSequenceRange(t *testing.T) {
	t.Parallel()
	now := time.Now()
	r := operate.ReplayRange{Subject: jobs.JobsSubjects, Since: now.Add(-time.Hour), Until: now.Add(-2 * time.Hour)}
	if err := r.Validate(); err == nil {
		t.Fatalf("since %s, until %s (an hour before it): accepted", r.Since.Format(time.RFC3339), r.Until.Format(time.RFC3339))
	}
}
