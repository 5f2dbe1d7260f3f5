// Package worker runs toolq's jobs: it pulls them from JetStream, claims
// their keys in the ledger (claims that arrive together share one round
// trip), runs the tools, records the outcome, publishes the result and only
// then acknowledges the job.
//
// The processing of one delivery, the state machine of docs/design.md, is
// delivery.run in delivery.go, read top to bottom; it returns one outcome,
// and settle in outcome.go is the one place that turns an outcome into a
// JetStream verb and counts it. This file holds the configuration and the
// fetch loop with its drain.
package worker

import (
	"context"
	"crypto/rand"
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

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/internal/pull"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
)

// FaultPoint names a point in the processing of a job where a test can stop
// the worker (see TestConfig.Hook).
type FaultPoint string

// The fault points, in the order a job passes them.
const (
	AfterClaim FaultPoint = "after_claim" // the key is claimed; nothing was sent
	// AfterApprovalRequest: the call awaits approval in the ledger; no
	// pending result is published.
	AfterApprovalRequest FaultPoint = "after_approval_request"
	DuringTool           FaultPoint = "during_tool"    // the downstream has answered; the worker has not recorded it
	AfterComplete        FaultPoint = "after_complete" // the outcome is in the ledger; no result is published
	AfterPublish         FaultPoint = "after_publish"  // the result is published; the job is not acknowledged
	BeforeAck            FaultPoint = "before_ack"     // about to acknowledge
)

// Config configures a Worker. JS, Ledger and Tools are required; the rest
// has defaults.
type Config struct {
	JS       jetstream.JetStream
	Ledger   *ledger.Store
	Tools    *tools.Registry
	Streams  jobs.Streams
	Consumer Consumer

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
	// Approvals decides calls awaiting approval and sweeps them (nil: one
	// made from this configuration). ApprovalSweep is how often Run
	// expires undecided calls past their ttl and publishes again the
	// decided calls whose answers a stopped process left unpublished
	// (default 5s; negative: never, for tests).
	Approvals     *approvals.Service
	ApprovalSweep time.Duration
	Logger        *slog.Logger
	// TracerProvider, MeterProvider and Propagator default to
	// OpenTelemetry's globals. With a noop.TracerProvider (the consumer's
	// when it exports no traces) the worker builds no span attributes.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagator     propagation.TextMapPropagator

	// Test holds knobs for tests only; production code leaves it zero.
	Test TestConfig
}

// TestConfig holds the worker's test-only knobs. Nothing in production sets
// them.
type TestConfig struct {
	// Hook, when set, is called at each FaultPoint of each job. The fault
	// tests use it to kill the process at a precise point.
	Hook func(FaultPoint, *jobs.Job)
	// LoseClaimAnswer, when set and returning true, makes a claim batch
	// that committed report a ledger outage instead, as when the
	// connection breaks before the answer arrives.
	LoseClaimAnswer func() bool
	// FailClaim, when set and returning true, makes a claim batch fail with
	// a ledger outage before it reaches the ledger.
	FailClaim func() bool
}

func (c *Config) fill() error {
	if c.JS == nil || c.Ledger == nil || c.Tools == nil {
		return errors.New("worker: JS, Ledger and Tools are required")
	}
	for _, t := range c.Tools.Tools() {
		if t.Class == tools.TransactionalWrite && c.Ledger.Backend() != "postgres" {
			return fmt.Errorf("worker: tool %q is a transactional_write, whose effect commits in the ledger's own transaction: "+
				"that needs the Postgres ledger, and this one is %s (give the consumer a postgres:// database URL, "+
				"or make the tool another class)", t.Name, c.Ledger.Backend())
		}
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
	if c.ApprovalSweep == 0 {
		c.ApprovalSweep = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
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

// Worker processes jobs. Create it with New, run it with Run.
type Worker struct {
	cfg      Config
	log      *slog.Logger
	consumer jetstream.Consumer
	limit    deliveryLimit
	ackWait  time.Duration

	slots      chan struct{}      // one per job in flight
	idle       chan jetstream.Msg // goroutines waiting for their next delivery (dispatch)
	inFlight   sync.WaitGroup
	tracer     trace.Tracer
	spansOff   bool // the tracer records nothing, ever: no attributes are built for it
	metrics    *instruments
	propagator propagation.TextMapPropagator
	claims     *batcher[ledger.Claim, ledger.ClaimResult]
	commits    *batcher[ledger.Completion, error]
	approvals  *approvals.Service
	stats      Stats
	// held maps a key to the delivery of this process that holds its
	// claim, so that a claim whose answer was lost is recognised as this
	// delivery's own, and never as another's.
	held sync.Map
}

// claimFunc is the ledger's batch claim, with the test knob that loses its
// answer.
func claimFunc(cfg Config) func(context.Context, []ledger.Claim) ([]ledger.ClaimResult, error) {
	lose, fail := cfg.Test.LoseClaimAnswer, cfg.Test.FailClaim
	if lose == nil && fail == nil {
		return cfg.Ledger.Claim
	}
	return func(ctx context.Context, cs []ledger.Claim) ([]ledger.ClaimResult, error) {
		if fail != nil && fail() {
			return nil, fmt.Errorf("%w: the ledger could not be reached (test)", ledger.ErrUnavailable)
		}
		out, err := cfg.Ledger.Claim(ctx, cs)
		if lose == nil {
			return out, err
		}
		if err == nil && lose() {
			return nil, fmt.Errorf("%w: the claim's answer was lost (test)", ledger.ErrUnavailable)
		}
		return out, err
	}
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
	if cfg.Consumer.Tenants == nil {
		cfg.Consumer.Tenants = cfg.Streams.Tenants
	}
	cons, err := cfg.Consumer.provision(ctx, cfg.JS)
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
	appr := cfg.Approvals
	if appr == nil {
		if appr, err = approvals.New(approvals.Config{Ledger: cfg.Ledger, JS: cfg.JS, Logger: cfg.Logger,
			TracerProvider: cfg.TracerProvider, MeterProvider: cfg.MeterProvider, Propagator: cfg.Propagator, Tenants: cfg.Streams.Tenants}); err != nil {
			return nil, fmt.Errorf("worker: approvals: %w", err)
		}
	}
	return &Worker{
		metrics:    metrics,
		cfg:        cfg,
		log:        cfg.Logger,
		consumer:   cons,
		limit:      deliveryLimit{max: cfg.Consumer.withDefaults().MaxDeliver},
		ackWait:    ackWait,
		slots:      make(chan struct{}, cfg.MaxInFlight),
		idle:       make(chan jetstream.Msg),
		tracer:     cfg.TracerProvider.Tracer(tracerName),
		spansOff:   isNoop(cfg.TracerProvider),
		propagator: cfg.Propagator,
		claims:     newBatcher(cfg.BatchSize, claimFunc(cfg)),
		commits:    newBatcher(cfg.BatchSize, cfg.Ledger.CompleteBatch),
		approvals:  appr,
	}, nil
}

// Run fetches and processes jobs until ctx ends (or, with UntilEmpty, until
// nothing is left), then drains: it stops fetching and starting tool calls
// at once, hands back every job whose tool call has not begun, and lets
// running calls finish for up to ShutdownTimeout, counted from the moment
// ctx ended. It returns nil after a clean drain.
func (w *Worker) Run(ctx context.Context) error {
	// Jobs keep running on runCtx after ctx ends, until the drain gives up
	// on them. startCtx ends with ctx: a job that has not begun its tool
	// call by then is handed back instead.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	startCtx, stopStarting := context.WithCancel(runCtx)
	defer stopStarting()
	defer context.AfterFunc(ctx, stopStarting)()
	w.claims.start(runCtx)
	w.commits.start(runCtx)
	if w.cfg.ApprovalSweep > 0 {
		sweepCtx, stopSweep := context.WithCancel(startCtx)
		swept := make(chan struct{})
		go func() { defer close(swept); w.approvals.Run(sweepCtx, w.cfg.ApprovalSweep) }()
		defer func() { stopSweep(); <-swept }()
	}
	defer func() { cancelRun(); <-w.claims.done; <-w.commits.done }()

	p, err := w.startPull(startCtx)
	if err != nil {
		return err
	}
	idle := time.NewTicker(100 * time.Millisecond)
	defer idle.Stop()
loop:
	for {
		select {
		case <-startCtx.Done():
			break loop
		case msg, ok := <-p.incoming:
			if !ok { // the drain started while the pull was being set up again
				break loop
			}
			if !w.takeSlot(startCtx, msg) { // draining: never start what waited for a slot
				w.handBack(runCtx, msg)
				break loop
			}
			w.inFlight.Add(1)
			w.dispatch(runCtx, startCtx, msg)
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
	// The loop leaves as soon as ctx ends (it never blocks on anything
	// else), so the shutdown timeout counts from there.
	stopStarting()
	deadline := time.NewTimer(w.cfg.ShutdownTimeout)
	defer deadline.Stop()
	// Stop pulling; what the client had buffered comes out of incoming and
	// goes back at once.
	p.drain()
	for msg := range p.incoming {
		w.handBack(runCtx, msg)
	}
	done := make(chan struct{})
	go func() { w.inFlight.Wait(); close(done) }()
	select {
	case <-done:
	case <-deadline.C:
		err = errors.Join(err, fmt.Errorf("worker: %d job(s) still running after the shutdown timeout (%s); their leases will expire", len(w.slots), w.cfg.ShutdownTimeout))
		cancelRun()
	}
	return err
}

// puller feeds the fetch loop from the durable consumer. A pull that ends
// on its own (the consumer deleted and so re-created, the connection
// closed) is set up again, and an error that does not end it (a missed
// heartbeat, a leadership change) is logged: the worker never stops pulling
// before the drain.
type puller struct {
	w        *Worker
	incoming chan jetstream.Msg // closed once the pull has stopped for good

	mu       sync.Mutex
	iter     *pull.Iter
	draining bool
}

// pullExpiry is how long one pull request waits on the server. The client
// expects a heartbeat every half of it, and after two missed heartbeats it
// issues a new request: a pull that stopped being served (a pull request
// the server lost track of) costs this long, not the library's default 30 s.
// The client's own lost request (see internal/pull) costs a 50 ms slice.
const pullExpiry = jetstream.PullExpiry(5 * time.Second)

func (w *Worker) startPull(startCtx context.Context) (*puller, error) {
	iter, err := w.consumer.Messages(jetstream.PullMaxMessages(w.cfg.BatchSize), pullExpiry)
	if err != nil {
		return nil, fmt.Errorf("worker: pull from %s: %w", jobs.JobsStream, err)
	}
	p := &puller{w: w, incoming: make(chan jetstream.Msg), iter: pull.New(iter, w.cfg.JS.Conn())}
	go p.run(startCtx)
	return p, nil
}

func (p *puller) run(startCtx context.Context) {
	defer close(p.incoming)
	p.mu.Lock()
	iter := p.iter
	p.mu.Unlock()
	for {
		msg, err := iter.Next()
		if err == nil {
			p.incoming <- msg
			continue
		}
		p.mu.Lock()
		draining := p.draining
		p.mu.Unlock()
		if draining {
			return // drained: what it had buffered came out before this
		}
		if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			p.w.log.Warn("pulling jobs", "stream", jobs.JobsStream, "error", err)
			if ctxSleep(startCtx, 50*time.Millisecond) != nil {
				return
			}
			continue
		}
		p.w.log.Warn("the pull ended; setting it up again", "stream", jobs.JobsStream, "error", err)
		if iter = p.again(startCtx); iter == nil {
			return
		}
	}
}

// again provisions the durable consumer and pulls from it anew, backing off
// while that fails, until the drain starts (nil then).
func (p *puller) again(startCtx context.Context) *pull.Iter {
	wait := 100 * time.Millisecond
	for {
		if ctxSleep(startCtx, wait) != nil {
			return nil
		}
		wait = min(2*wait, 10*time.Second)
		cons, err := p.w.cfg.Consumer.provision(startCtx, p.w.cfg.JS)
		if err != nil {
			p.w.log.Warn("setting up the pull again", "error", err)
			continue
		}
		iter, err := cons.Messages(jetstream.PullMaxMessages(p.w.cfg.BatchSize), pullExpiry)
		if err != nil {
			p.w.log.Warn("setting up the pull again", "error", err)
			continue
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.draining {
			iter.Stop()
			return nil
		}
		p.iter = pull.New(iter, p.w.cfg.JS.Conn())
		p.w.log.Info("pulling again", "stream", jobs.JobsStream)
		return p.iter
	}
}

// drain stops pulling; what the client had buffered still comes out of
// incoming, which is then closed.
func (p *puller) drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.draining = true
	p.iter.Drain()
}

// takeSlot waits for a free slot, telling JetStream the message is in
// progress meanwhile so that it is not redelivered to another worker while
// it waits here. It reports false when the drain starts first.
func (w *Worker) takeSlot(startCtx context.Context, msg jetstream.Msg) bool {
	select {
	case w.slots <- struct{}{}:
		return true
	default:
	}
	progress := time.NewTicker(max(w.ackWait/3, 10*time.Millisecond))
	defer progress.Stop()
	for {
		select {
		case w.slots <- struct{}{}:
			return true
		case <-startCtx.Done():
			return false
		case <-progress.C:
			msg.InProgress()
		}
	}
}

// dispatch hands a delivery that holds a slot to an idle goroutine of an
// earlier one, or to a new goroutine. A goroutine that has processed a
// delivery waits a while for the next: its stack has grown to what a
// delivery needs, and a new goroutine's would grow again, copying itself
// on the way (a tenth of the consumer's CPU on the duplicate path).
func (w *Worker) dispatch(runCtx, startCtx context.Context, msg jetstream.Msg) {
	select {
	case w.idle <- msg:
	default:
		go w.serve(runCtx, startCtx, msg)
	}
}

// idleGoroutine is how long a goroutine that processed a delivery waits
// for another before it ends.
const idleGoroutine = 5 * time.Second

// serve processes msg, then each delivery dispatch hands it, until none
// came for idleGoroutine or the drain started.
func (w *Worker) serve(runCtx, startCtx context.Context, msg jetstream.Msg) {
	var idle *time.Timer
	for {
		w.process(runCtx, startCtx, msg)
		if idle == nil {
			idle = time.NewTimer(idleGoroutine)
			defer idle.Stop()
		} else {
			idle.Reset(idleGoroutine)
		}
		select {
		case msg = <-w.idle:
		case <-idle.C:
			return
		case <-startCtx.Done():
			return
		}
	}
}

// process runs one delivery, holding a slot.
func (w *Worker) process(runCtx, startCtx context.Context, msg jetstream.Msg) {
	defer func() {
		<-w.slots
		w.inFlight.Done()
	}()
	d := w.newDelivery(runCtx, startCtx, msg)
	w.settle(runCtx, d, d.run())
	if d.key != "" {
		w.held.CompareAndDelete(d.key, d)
	}
}

// handBack returns a message the drain will not process: it is delivered
// again at once, to another worker, without counting toward its limit.
func (w *Worker) handBack(runCtx context.Context, msg jetstream.Msg) {
	d := w.newDelivery(runCtx, runCtx, msg)
	w.settle(runCtx, d, retryUncounted(0, errors.New("the worker is draining")))
}

func (w *Worker) newDelivery(runCtx, startCtx context.Context, msg jetstream.Msg) *delivery {
	d := &delivery{w: w, msg: msg, runCtx: runCtx, startCtx: startCtx, token: rand.Text()}
	if meta, err := msg.Metadata(); err == nil {
		d.meta, d.deliveries = meta, int(meta.NumDelivered)
	}
	return d
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

func (w *Worker) claimOf(d *delivery) ledger.Claim {
	return ledger.Claim{
		Key:            d.key,
		ConversationID: d.job.ConversationID,
		TurnIndex:      d.job.TurnIndex,
		Tool:           d.job.Tool,
		Ordinal:        d.job.Ordinal,
		ArgsDigest:     d.material.ArgsDigest(),
		ToolUseID:      d.job.ToolUseID,
		Tenant:         d.job.Tenant,
		Owner:          w.cfg.Owner,
		Lease:          d.tool.Lease,
		TraceID:        d.span.SpanContext().TraceID().String(),
		SpanID:         d.span.SpanContext().SpanID().String(),
		Token:          d.token,
		// A keyed write whose key goes downstream may run again under the
		// same key, as a takeover runs it: a claim the ledger loses in a
		// crash costs a repeat the downstream collapses, so it need not
		// wait for the disk. So for a transactional write: its effect
		// commits only with a completion fenced by the claim's token, and
		// that commit makes the claim durable with it. Any other write's
		// claim is what stops its second run (a keyed write that does not
		// forward its key has no downstream to collapse one): it waits.
		AsyncCommit: d.tool.Class == tools.KeyedWrite && d.tool.ForwardsKey || d.tool.Class == tools.TransactionalWrite,
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

// ctxSleep waits d, or until ctx ends (its error then).
func ctxSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
