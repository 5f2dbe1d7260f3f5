// Package worker runs toolq's jobs: it pulls them from JetStream in batches,
// claims their keys in the ledger in one round trip, runs the tools, records
// the outcome, publishes the result and only then acknowledges the job. The
// processing of one delivery, DESIGN.md's state machine, is settle and
// execute in process.go; everything around it (fetching, batching, draining,
// dead letters) is here.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
)

// FaultPoint names a point in the processing of a job where a test can stop
// the worker (see Config.Hook).
type FaultPoint string

// The fault points, in the order a job passes them.
const (
	AfterClaim    FaultPoint = "after_claim"    // the key is claimed; nothing was sent
	DuringTool    FaultPoint = "during_tool"    // the downstream has answered; the worker has not recorded it
	AfterComplete FaultPoint = "after_complete" // the outcome is in the ledger; no result is published
	AfterPublish  FaultPoint = "after_publish"  // the result is published; the job is not acknowledged
	BeforeAck     FaultPoint = "before_ack"     // about to acknowledge
)

// Config configures a Worker. JS, Ledger and Tools are required; the rest
// has defaults.
type Config struct {
	JS       jetstream.JetStream
	Ledger   *ledger.Store
	Tools    *tools.Registry
	Streams  jobs.Streams
	Consumer jobs.Consumer

	Owner           string        // names this worker in ledger rows (default host:pid)
	BatchSize       int           // jobs per pull (default 32)
	MaxInFlight     int           // jobs processed at once (default 4×BatchSize)
	MaxBodySize     int           // larger jobs are dead-lettered (default 256 KiB; keep it below the server's max payload)
	RetryDelay      time.Duration // first delay of a retry without a hint from the tool (default 1s, doubling per delivery up to 1m)
	ShutdownTimeout time.Duration // how long a drain lets running tools finish (default 30s)
	// InFlightWait is how long a delivery whose call another attempt is
	// running waits in process for it to settle before handing the job back
	// to JetStream (default 5s).
	InFlightWait time.Duration
	UntilEmpty   bool // return once nothing is pending and nothing is in flight
	Logger       *slog.Logger
	// TracerProvider, MeterProvider and Propagator default to
	// OpenTelemetry's globals.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagator     propagation.TextMapPropagator

	// Hook, when set, is called at each FaultPoint of each job. Tests use
	// it to kill the process at a precise point.
	Hook func(FaultPoint, *jobs.Job)
}

func (c *Config) fill() error {
	if c.JS == nil || c.Ledger == nil || c.Tools == nil {
		return errors.New("worker: JS, Ledger and Tools are required")
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 32
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 4 * c.BatchSize
	}
	if c.MaxBodySize <= 0 {
		c.MaxBodySize = 256 << 10
	}
	if c.RetryDelay <= 0 {
		c.RetryDelay = time.Second
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.InFlightWait <= 0 {
		c.InFlightWait = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Hook == nil {
		c.Hook = func(FaultPoint, *jobs.Job) {}
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = otel.GetTextMapPropagator()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	return nil
}

// crashGuard × MaxDeliver deliveries dead-letter a job on arrival.
const crashGuard = 3

// Worker processes jobs. Create it with New, run it with Run.
type Worker struct {
	cfg      Config
	log      *slog.Logger
	consumer jetstream.Consumer
	limit    int // deliveries before a job is dead-lettered
	ackWait  time.Duration

	slots      chan struct{} // one per job in flight
	inFlight   sync.WaitGroup
	tracer     trace.Tracer
	metrics    *instruments
	propagator propagation.TextMapPropagator
	claims     *batcher[ledger.Claim, ledger.ClaimResult]
	commits    *batcher[ledger.Completion, error]
	stats      Stats
}

// New provisions the streams and the durable consumer (creating or updating
// them) and returns a worker.
func New(ctx context.Context, cfg Config) (*Worker, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if err := jobs.ProvisionStreams(ctx, cfg.JS, cfg.Streams); err != nil {
		return nil, err
	}
	cons, err := jobs.ProvisionConsumer(ctx, cfg.JS, cfg.Consumer)
	if err != nil {
		return nil, err
	}
	// The shortest redelivery timer JetStream may apply: InProgress must
	// come more often than that.
	ackWait := cons.CachedInfo().Config.AckWait
	for _, b := range cons.CachedInfo().Config.BackOff {
		ackWait = min(ackWait, b)
	}
	metrics, err := newInstruments(cfg.MeterProvider, cfg.Tools)
	if err != nil {
		return nil, fmt.Errorf("worker: metrics: %w", err)
	}
	return &Worker{
		metrics:    metrics,
		cfg:        cfg,
		log:        cfg.Logger,
		consumer:   cons,
		limit:      cfg.Consumer.Limit(),
		ackWait:    ackWait,
		slots:      make(chan struct{}, cfg.MaxInFlight),
		tracer:     cfg.TracerProvider.Tracer(tracerName),
		propagator: cfg.Propagator,
		claims:     newBatcher(cfg.BatchSize, cfg.Ledger.Claim),
		commits:    newBatcher(cfg.BatchSize, cfg.Ledger.CompleteBatch),
	}, nil
}

// Run fetches and processes jobs until ctx ends (or, with UntilEmpty, until
// nothing is left), then drains: it stops fetching, lets running tools
// finish for up to ShutdownTimeout, releases the claims of jobs that had not
// started and naks them. It returns nil after a clean drain.
func (w *Worker) Run(ctx context.Context) error {
	// Jobs keep running on this context after ctx ends, until the drain
	// gives up on them.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	// startCtx ends when the drain starts: a job that has not begun its tool
	// call by then is released instead.
	startCtx, stopStarting := context.WithCancel(runCtx)
	defer stopStarting()
	go w.claims.run(runCtx)
	go w.commits.run(runCtx)
	defer func() { cancelRun(); <-w.claims.done; <-w.commits.done }()

	iter, err := w.consumer.Messages(jetstream.PullMaxMessages(w.cfg.BatchSize))
	if err != nil {
		return fmt.Errorf("worker: pull from %s: %w", jobs.JobsStream, err)
	}
	incoming := make(chan jetstream.Msg)
	go func() {
		defer close(incoming)
		for {
			msg, err := iter.Next()
			if err != nil {
				return // the iterator was stopped or drained
			}
			incoming <- msg
		}
	}()
	idle := time.NewTicker(100 * time.Millisecond)
	defer idle.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case msg, ok := <-incoming:
			if !ok {
				err = fmt.Errorf("worker: the pull from %s ended (was the consumer deleted?)", jobs.JobsStream)
				break loop
			}
			// Take what else has arrived, without waiting: one claim round
			// trip for the lot.
			batch := []jetstream.Msg{msg}
		more:
			for len(batch) < w.cfg.BatchSize {
				select {
				case m, ok := <-incoming:
					if !ok {
						break more
					}
					batch = append(batch, m)
				default:
					break more
				}
			}
			w.handleBatch(ctx, runCtx, startCtx, batch)
		case <-idle.C:
			if w.cfg.UntilEmpty {
				empty, err := w.empty(ctx)
				if err != nil {
					w.log.Warn("consumer info failed", "error", err)
				}
				if empty {
					break loop
				}
			}
		}
	}
	// Stop pulling; what the client had buffered comes out of incoming and
	// goes back at once.
	iter.Drain()
	for msg := range incoming {
		msg.Nak()
	}
	stopStarting()
	done := make(chan struct{})
	go func() { w.inFlight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(w.cfg.ShutdownTimeout):
		err = errors.Join(err, fmt.Errorf("worker: %d job(s) still running after the shutdown timeout (%s); their leases will expire", len(w.slots), w.cfg.ShutdownTimeout))
		cancelRun()
	}
	return err
}

// empty reports whether the durable has nothing pending, nothing awaiting
// an ack anywhere, and this worker nothing in flight.
func (w *Worker) empty(ctx context.Context) (bool, error) {
	if len(w.slots) > 0 {
		return false, nil
	}
	info, err := w.consumer.Info(ctx)
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0 && len(w.slots) == 0, nil
}

// delivery is one fetched message and what was learned of it.
type delivery struct {
	msg        jetstream.Msg
	meta       *jetstream.MsgMetadata
	job        *jobs.Job
	key        string
	material   jobs.Material
	tool       *tools.Tool
	deliveries int
	ctx        context.Context // carries the process span
	span       trace.Span
}

// handleBatch validates each message and processes every job in its own
// goroutine. Claims go through the claim batcher, so the claims of jobs that
// arrive together take one round trip; while the ledger is unreachable the
// jobs wait there (holding their slots, so fetching stops) until ctx ends.
func (w *Worker) handleBatch(ctx, runCtx, startCtx context.Context, msgs []jetstream.Msg) {
	for _, msg := range msgs {
		w.slots <- struct{}{}
		w.inFlight.Add(1)
		d, err := w.decode(msg)
		w.startProcess(runCtx, d)
		go w.finish(runCtx, d, func() error {
			var rej *rejectError
			switch {
			case errors.As(err, &rej):
				return w.publishRejected(runCtx, d, rej)
			case err != nil:
				return err
			case !d.tool.UsesLedger:
				return w.process(runCtx, startCtx, d, nil)
			}
			var claim ledger.ClaimResult
			cctx, span := w.child(runCtx, d, "toolq.claim", trace.SpanKindInternal)
			start := time.Now()
			err := w.durably(ctx, "claim", d, func() (err error) {
				claim, err = w.claims.do(cctx, w.claimOf(d))
				return err
			})
			w.metrics.claimLatency.Record(runCtx, time.Since(start).Seconds())
			if err != nil {
				span.RecordError(err)
			}
			span.End()
			if err != nil {
				return uncountedRetry(w.backoff(d), fmt.Errorf("claim: %w", err))
			}
			return w.process(runCtx, startCtx, d, &claim)
		})
	}
}

func (w *Worker) claimOf(d *delivery) ledger.Claim {
	return ledger.Claim{
		Key:            d.key,
		ConversationID: d.job.ConversationID,
		TurnIndex:      d.job.TurnIndex,
		Tool:           d.job.Tool,
		Ordinal:        d.job.Ordinal,
		ArgsDigest:     d.material.ArgsDigest(),
		ToolUseID:      d.job.ToolUseID,
		Owner:          w.cfg.Owner,
		Lease:          d.tool.Lease,
		TraceID:        d.span.SpanContext().TraceID().String(),
		SpanID:         d.span.SpanContext().SpanID().String(),
	}
}

// decode turns a message into a delivery, or into an error that settles it:
// a dead letter for what is not a valid job, a rejected result for a valid
// job that cannot run. A nil error with a nil tool never happens.
func (w *Worker) decode(msg jetstream.Msg) (*delivery, error) {
	d := &delivery{msg: msg}
	meta, err := msg.Metadata()
	if err != nil {
		return d, deadLetter(jobs.DLQInvalid, fmt.Errorf("not a JetStream message: %w", err))
	}
	d.meta, d.deliveries = meta, int(meta.NumDelivered)
	// A job that keeps killing its worker never reaches the check in finish:
	// stop it on arrival. The guard is wider than the limit because
	// deliveries that waited on another attempt, or on an outage, do not
	// count toward the limit but do toward JetStream's delivery count.
	if d.deliveries > crashGuard*w.limit {
		return d, deadLetter(jobs.DLQMaxDeliver, fmt.Errorf("delivered %d times (more than %d × the limit of %d): a job that keeps stopping its worker, or one that never settles", d.deliveries, crashGuard, w.limit))
	}
	if len(msg.Data()) > w.cfg.MaxBodySize {
		return d, deadLetter(jobs.DLQTooLarge, fmt.Errorf("body of %d bytes exceeds the limit of %d", len(msg.Data()), w.cfg.MaxBodySize))
	}
	if d.job, err = jobs.DecodeJob(msg.Data()); err != nil {
		return d, deadLetter(jobs.DLQInvalid, err)
	}
	if subj := jobs.JobSubject(d.job.Tool); msg.Subject() != subj {
		return d, deadLetter(jobs.DLQInvalid, fmt.Errorf("job for tool %q published on %s, want %s", d.job.Tool, msg.Subject(), subj))
	}
	if d.material, err = d.job.Call().Material(); err != nil {
		return d, deadLetter(jobs.DLQInvalid, err)
	}
	d.key = d.material.Key()
	if sent := msg.Headers().Get(jobs.HeaderKey); sent != "" && sent != d.key {
		return d, w.reject(d, "key_mismatch", fmt.Sprintf("the publisher's %s %s differs from the derived key %s", jobs.HeaderKey, sent, d.key))
	}
	tool, ok := w.cfg.Tools.Lookup(d.job.Tool)
	if !ok {
		return d, w.reject(d, "unknown_tool", fmt.Sprintf("no tool %q is registered", d.job.Tool))
	}
	if err := tool.Validate(d.job.Args); err != nil {
		return d, w.reject(d, "invalid_args", err.Error())
	}
	d.tool = tool
	return d, nil
}

// finish runs the processing of one delivery and answers JetStream. It is
// the one place where outcomes become JetStream verbs: nil → Ack; a dead
// letter → DLQ then Term; retry-after(d) → NakWithDelay(d), or the DLQ once
// the delivery limit is reached; any other error → NakWithDelay(backoff).
func (w *Worker) finish(ctx context.Context, d *delivery, process func() error) {
	defer func() {
		<-w.slots
		w.inFlight.Done()
	}()
	err := process()
	var dead *deadLetterError
	var retry *retryError
	switch {
	case err == nil:
		if d.job != nil {
			w.cfg.Hook(BeforeAck, d.job)
		}
		w.ack(d, d.msg.Ack())
		endProcess(d, "ack", nil)
	case errors.As(err, &dead):
		w.count(d, "dead_letter")
		w.deadLetter(ctx, d, dead)
		endProcess(d, "dead_letter", err)
	case errors.As(err, &retry) && d.deliveries >= w.limit && !retry.uncounted:
		w.count(d, "dead_letter")
		dead := &deadLetterError{reason: jobs.DLQMaxDeliver, err: fmt.Errorf("still unsettled after %d deliveries: %w", d.deliveries, retry.err)}
		w.deadLetter(ctx, d, dead)
		endProcess(d, "dead_letter", dead)
	case errors.As(err, &retry):
		w.count(d, "retry")
		w.log.Info("job retried later", w.attrs(d, "delay", retry.after, "reason", retry.err.Error())...)
		w.ack(d, d.msg.NakWithDelay(retry.after))
		endProcess(d, "nak", err)
	default:
		w.count(d, "retry")
		w.log.Warn("job failed, retried later", w.attrs(d, "error", err)...)
		w.ack(d, d.msg.NakWithDelay(w.backoff(d)))
		endProcess(d, "nak", err)
	}
}

func (w *Worker) ack(d *delivery, err error) {
	if err != nil {
		w.log.Warn("answering JetStream failed; the job will be redelivered", w.attrs(d, "error", err)...)
	}
}

// backoff is the delay before the next delivery when the tool gave none:
// RetryDelay doubled per delivery, at most a minute.
func (w *Worker) backoff(d *delivery) time.Duration {
	delay := w.cfg.RetryDelay
	for i := 1; i < d.deliveries && delay < time.Minute; i++ {
		delay *= 2
	}
	return min(delay, time.Minute)
}

func (w *Worker) attrs(d *delivery, more ...any) []any {
	a := []any{"deliveries", d.deliveries}
	if d.meta != nil {
		a = append(a, "stream_seq", d.meta.Sequence.Stream)
	}
	if d.job != nil {
		a = append(a, "key", d.key, "tool", d.job.Tool, "tool_use_id", d.job.ToolUseID)
	}
	return append(a, more...)
}
