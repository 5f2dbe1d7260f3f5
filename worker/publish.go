package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tracing"
)

// publish is step 6: publish the result and wait for JetStream to have it.
// The message id makes a second publication after a crash a no-op. The
// delivery is then answered, as label; while the broker is out it waits, and
// when the drain gives up it hands the job back uncounted.
func (d *delivery) publish(r *jobs.Result, label Outcome) outcome {
	body, err := json.Marshal(r)
	if err != nil {
		return retryAfter(d.w.backoff(d), fmt.Errorf("encode result: %w", err))
	}
	subject, msgID := jobs.ResultSubject(d.job.ConversationID), jobs.ResultMsgID(d.key, d.job.ToolUseID)
	ctx, span := d.child(d.runCtx, "publish toolq.results", trace.SpanKindProducer,
		tracing.MessagingSystem.String("nats"), tracing.MessagingDestination.String(subject),
		tracing.MessagingMessageID.String(msgID), tracing.MessagingOperation.String("send"),
		tracing.KeyResultStatus.String(string(r.Status)), tracing.KeyDuplicate.Bool(r.Duplicate))
	defer span.End()
	d.span.SetAttributes(tracing.KeyResultStatus.String(string(r.Status)), tracing.KeyDuplicate.Bool(r.Duplicate))
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set(jobs.HeaderKey, d.key)
	d.w.propagator.Inject(ctx, jobs.HeaderCarrier(msg.Header))
	err = d.durably(ctx, "publish result", func() error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := d.w.cfg.JS.PublishMsg(pctx, msg, jetstream.WithMsgID(msgID)); err != nil {
			return &brokerError{err}
		}
		return nil
	})
	if err != nil {
		return retryUncounted(d.w.backoff(d), fmt.Errorf("publish result: %w", err))
	}
	d.hook(AfterPublish)
	return answered(label)
}

// publishDeadLetter publishes the message to toolq.dlq.<reason> with its
// headers, the reason and what the ledger knew of the call.
func (w *Worker) publishDeadLetter(ctx context.Context, d *delivery, o outcome) error {
	msg := nats.NewMsg(jobs.DLQSubject(o.reason))
	msg.Data = d.msg.Data()
	for k, v := range d.msg.Headers() {
		if !strings.HasPrefix(k, "Nats-") { // JetStream's control headers (msg id, expected stream) would misdirect the copy
			msg.Header[k] = v
		}
	}
	var seq uint64
	if d.meta != nil {
		seq = d.meta.Sequence.Stream
	}
	msg.Header.Set(jobs.HeaderDLQReason, o.reason)
	msg.Header.Set(jobs.HeaderDLQDetail, oneLine(o.err.Error()))
	msg.Header.Set(jobs.HeaderDLQSubject, d.msg.Subject())
	msg.Header.Set(jobs.HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	msg.Header.Set(jobs.HeaderDLQDeliveries, strconv.Itoa(d.deliveries))
	msg.Header.Set(jobs.HeaderDLQConsumer, w.consumer.CachedInfo().Name)
	if d.key != "" {
		if row, err := w.cfg.Ledger.Get(ctx, d.key); err == nil {
			msg.Header.Set(jobs.HeaderDLQHistory, fmt.Sprintf("key=%s state=%s attempt=%d owner=%s error=%s", row.Key, row.State, row.Attempt, row.Owner, errorText(row.Error)))
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := w.cfg.JS.PublishMsg(pctx, msg, jetstream.WithMsgID(fmt.Sprintf("dlq:%d:%s", seq, o.reason)))
	return err
}

func errorText(e *ledger.ErrorInfo) string {
	if e == nil {
		return ""
	}
	return e.Code + ": " + e.Message
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
