package operate

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/jsretry"
)

// scanIdle is how long the server keeps a scan's consumer that nobody
// reads (a scan whose process died): it is deleted when the scan ends.
const scanIdle = 5 * time.Minute

// scanStream reads the messages of stream on filter, from where cfg starts
// to the last one that existed when it began, calling each until it says
// stop. It reads no message published after it started (a replay's own).
// progress, when not nil, is called after each message.
//
// It reads through a consumer of its own that nobody acknowledges, in
// segments: every request is bounded by ctx and asked again by jsretry, and
// a batch lost on its way (the consumer's sequence skips, or nothing comes
// though messages are left) is read again by a new consumer from after the
// last message read. An ordered consumer would do the same, but re-creates
// its consumer without the caller's deadline, asking without end.
func scanStream(ctx context.Context, js jetstream.JetStream, stream, filter string, cfg jetstream.ConsumerConfig,
	progress func(done, total uint64), each func(jetstream.Msg) (bool, error)) error {
	cfg.FilterSubjects = []string{filter}
	cfg.AckPolicy = jetstream.AckNonePolicy
	cfg.MemoryStorage, cfg.Replicas, cfg.InactiveThreshold = true, 1, scanIdle
	name := "toolq_scan_" + rand.Text()
	var made []string
	defer func() { deleteConsumers(ctx, js, stream, made) }()
	segment := func() (jetstream.Consumer, error) {
		cfg.Name = fmt.Sprintf("%s_%d", name, len(made))
		made = append(made, cfg.Name)
		// A create asked again under the same name and config finds the
		// consumer the first made.
		cons, err := jsretry.Do(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
			return js.CreateOrUpdateConsumer(ctx, stream, cfg)
		})
		if err != nil {
			return nil, fmt.Errorf("operate: read %s: %w", stream, err)
		}
		return cons, nil
	}
	cons, err := segment()
	if err != nil {
		return err
	}
	total := cons.CachedInfo().NumPending
	var last uint64      // the stream sequence of the last message read
	var delivered uint64 // the consumer sequence of the last message read, on this segment
	var lastErr error    // why the last batch came short
	for left, short := total, 0; left > 0; {
		wait := jsretry.Patience()
		if deadline, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(deadline))
		}
		if wait <= 0 || ctx.Err() != nil {
			return fmt.Errorf("operate: read %s: stopped with %d message(s) unread: %w", stream, left, context.Cause(ctx))
		}
		batch, err := cons.Fetch(int(min(left, 256)), jetstream.FetchMaxWait(wait))
		if err != nil {
			return fmt.Errorf("operate: read %s: %w", stream, err)
		}
		got, gap := 0, false
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("operate: read %s: %w", stream, err)
			}
			if meta.Sequence.Consumer != delivered+1 {
				gap = true // messages delivered before this one were lost on their way
				break
			}
			got++
			left--
			delivered, last = meta.Sequence.Consumer, meta.Sequence.Stream
			more, err := each(m)
			if progress != nil {
				progress(total-left, total)
			}
			if err != nil || !more {
				return err
			}
		}
		if err := batch.Error(); err != nil {
			lastErr = err
		}
		if got > 0 && !gap {
			short = 0
			continue
		}
		if got == 0 {
			short++
		}
		if short == 3 {
			if lastErr == nil {
				lastErr = errors.New("no messages came")
			}
			return fmt.Errorf("operate: read %s: stopped with %d message(s) unread: %w", stream, left, lastErr)
		}
		// Read on from after the last message read, with a consumer of
		// its own; the one that lost them is deleted at the end.
		if last > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = jetstream.DeliverByStartSequencePolicy, last+1, nil
		}
		if cons, err = segment(); err != nil {
			return err
		}
		delivered = 0
	}
	return nil
}

// deleteConsumers deletes a scan's consumers, best effort: one that is
// left is removed by the server once idle for scanIdle.
func deleteConsumers(ctx context.Context, js jetstream.JetStream, stream string, names []string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), jsretry.Patience())
	defer cancel()
	for _, name := range names {
		if err := js.DeleteConsumer(ctx, stream, name); err != nil && ctx.Err() != nil {
			return
		}
	}
}
