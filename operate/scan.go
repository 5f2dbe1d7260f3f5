package operate

import (
	"cmp"
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
// stop. It reads no message published after it began (a replay's own, an
// agent's new job), and ends at once when messages it was to read were
// deleted meanwhile (a dead letter requeued, a job past the stream's age).
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
	s, err := streamOf(ctx, js, stream)
	if err != nil {
		return fmt.Errorf("operate: read %s: %w", stream, err)
	}
	bound := s.CachedInfo().State.LastSeq // the last message that existed when the scan began
	// left asks the stream's leader (STREAM.MSG.GET): a direct get, on a
	// stream that allows them, is answered by any replica or mirror, one
	// still catching up (nothing left, said too soon) or one that keeps
	// what the stream deleted (a message left that no consumer delivers).
	// This handle is the scan's own.
	s.CachedInfo().Config.AllowDirect = false
	// A batch of 256 jobs near the largest payload would be more than the
	// server buffers for a connection (it closes it as a slow consumer):
	// a batch is bounded by bytes too, room for two of the largest.
	maxBytes := 16 << 20
	if nc := js.Conn(); nc != nil {
		maxBytes = max(maxBytes, 2*int(nc.MaxPayload())+4096)
	}
	cfg.FilterSubjects = []string{filter}
	cfg.AckPolicy = jetstream.AckNonePolicy
	cfg.MemoryStorage, cfg.Replicas, cfg.InactiveThreshold = true, 1, scanIdle
	name := "toolq_scan_" + rand.Text()
	var made []string
	defer func() { deleteConsumers(ctx, js, stream, made) }()
	// segment creates the next consumer, and says how many messages it
	// has to deliver.
	segment := func() (jetstream.Consumer, uint64, error) {
		// A create asked again is asked under a new name: the cluster
		// places a consumer on one server when it is first asked for, and
		// the same name asked again goes to the same server, one that may
		// have just died. What an unanswered create made is deleted with
		// the rest.
		cons, err := jsretry.Do(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
			cfg.Name = fmt.Sprintf("%s_%d", name, len(made))
			made = append(made, cfg.Name)
			return js.CreateOrUpdateConsumer(ctx, stream, cfg)
		})
		if err != nil {
			return nil, 0, fmt.Errorf("operate: read %s: %w", stream, err)
		}
		return cons, cons.CachedInfo().NumPending, nil
	}
	cons, pending, err := segment()
	if err != nil {
		return err
	}
	total, done := pending, uint64(0)
	var last uint64                                // the stream sequence of the last message read
	var delivered uint64                           // the consumer sequence of the last message read, on this segment
	var lastErr error                              // why the last batch came short
	next := cons.CachedInfo().Delivered.Stream + 1 // where the scan reads on
	// left says whether messages before the bound are left to read. The
	// consumer counts what its server has stored: one placed on a server
	// still catching up counts 0 though the stream has more, so a 0 is
	// asked again of the stream's leader.
	left := func() (bool, error) {
		if last >= bound {
			return false, nil
		}
		if pending > 0 {
			return true, nil
		}
		m, err := jsretry.Do(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
			return s.GetMsg(ctx, next, jetstream.WithGetMsgSubject(filter))
		})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("operate: read %s: stopped after %d message(s): %w", stream, done, err)
		}
		return m.Sequence <= bound, nil
	}
	for short := 0; ; {
		if more, err := left(); err != nil || !more {
			return err
		}
		// pending is 0 when the stream's leader has more than the consumer:
		// read on as its server catches up.
		// After a batch that came empty, one message is asked for, of any
		// size: one larger than maxBytes (stored through a server that
		// allows larger payloads than the one asked) is answered with 409,
		// which the client takes for an empty batch.
		n, size := int(min(cmp.Or(pending, 256), 256)), maxBytes
		if short > 0 {
			n, size = 1, 0
		}
		batch, stop, err := fetch(ctx, cons, n, size)
		if err != nil {
			return fmt.Errorf("operate: read %s: %w", stream, err)
		}
		got, gap := 0, false
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			if err != nil {
				stop()
				return fmt.Errorf("operate: read %s: %w", stream, err)
			}
			if meta.Sequence.Consumer != delivered+1 {
				gap = true // messages delivered before this one were lost on their way
				break
			}
			if meta.Sequence.Stream > bound {
				stop()
				return nil // published after the scan began
			}
			got++
			done++
			delivered, last, pending = meta.Sequence.Consumer, meta.Sequence.Stream, meta.NumPending
			next = last + 1
			more, err := each(m)
			if progress != nil {
				progress(done, max(total, done))
			}
			if err != nil || !more {
				stop()
				return err
			}
			if pending == 0 || last >= bound {
				break
			}
		}
		stop()
		if err := batch.Error(); err != nil {
			lastErr = err
		}
		if last >= bound {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("operate: read %s: stopped after %d message(s): %w", stream, done, context.Cause(ctx))
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
			return fmt.Errorf("operate: read %s: stopped after %d message(s), more left: %w", stream, done, lastErr)
		}
		// Read on from after the last message read, with a consumer of
		// its own; the one that lost them is deleted at the end. What it
		// counts is what is left (messages deleted meanwhile are not).
		if last > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = jetstream.DeliverByStartSequencePolicy, last+1, nil
		}
		if cons, pending, err = segment(); err != nil {
			return err
		}
		if last == 0 {
			next = cons.CachedInfo().Delivered.Stream + 1
		}
		delivered = 0
	}
}

// fetch asks cons for up to n messages, of maxBytes at most (0: any), waiting
// Patience at most and no longer than ctx allows. stop ends the fetch (call
// it once the batch is read).
func fetch(ctx context.Context, cons jetstream.Consumer, n, maxBytes int) (jetstream.MessageBatch, context.CancelFunc, error) {
	fctx, stop := context.WithTimeout(ctx, jsretry.Patience())
	if err := ctx.Err(); err != nil {
		stop()
		return nil, nil, err
	}
	opts := []jetstream.FetchOpt{jetstream.FetchContext(fctx)}
	if maxBytes > 0 {
		opts = append(opts, jetstream.FetchMaxBytes(maxBytes))
	}
	batch, err := cons.Fetch(n, opts...)
	if err != nil {
		stop()
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, nil, err
	}
	return batch, stop, nil
}

// deleteConsumers deletes a scan's consumers, best effort, waiting no
// longer than ctx allows (a quarter second when it has ended): one that is
// left is removed by the server once idle for scanIdle.
func deleteConsumers(ctx context.Context, js jetstream.JetStream, stream string, names []string) {
	wait := jsretry.Patience()
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline))
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(wait, 250*time.Millisecond))
	defer cancel()
	for _, name := range names {
		if err := js.DeleteConsumer(ctx, stream, name); err != nil && ctx.Err() != nil {
			return
		}
	}
}
