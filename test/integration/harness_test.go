// Package integration holds toolq's end-to-end and fault-injection tests:
// real JetStream (in-process nats-server), real Postgres (or the SQLite
// ledger), the sandbox API, and workers in this process or in a subprocess
// that the tests kill.
package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

func TestMain(m *testing.M) {
	if helperMain() || natsNodeMain() {
		return
	}
	testenv.Main(m)
}

// registryYAML is the demo registry with short timeouts and leases, so that
// takeovers happen within a test's patience.
const registryYAML = `tools:
  - name: send_payment
    class: keyed_write
    timeout: 1500ms
    lease: 2s
    breaker: {failures: 1000}
    schema:
      type: object
      additionalProperties: false
      required: [invoice_id, amount_cents, currency]
      properties:
        invoice_id: {type: string, maxLength: 64}
        amount_cents: {type: integer, minimum: 1}
        currency: {type: string, pattern: "^[A-Z]{3}$"}
    http: {method: POST, url: "${TOOLQ_SANDBOX_URL}/v1/payments"}
  - name: approved_payment
    class: keyed_write
    timeout: 1500ms
    lease: 2s
    breaker: {failures: 1000}
    approval: {when: "args.amount_cents > 50000", group: finance}
    schema:
      type: object
      additionalProperties: false
      required: [invoice_id, amount_cents, currency]
      properties:
        invoice_id: {type: string, maxLength: 64}
        amount_cents: {type: integer, minimum: 1}
        currency: {type: string, pattern: "^[A-Z]{3}$"}
    http: {method: POST, url: "${TOOLQ_SANDBOX_URL}/v1/payments"}
  - name: send_payment_unledgered
    class: keyed_write
    ledger: false
    timeout: 1500ms
    breaker: {failures: 1000}
    schema: {type: object}
    http: {method: POST, url: "${TOOLQ_SANDBOX_URL}/v1/payments"}
  - name: gated_write
    class: keyed_write
    timeout: 20s
    breaker: {failures: 1000}
    schema: {type: object}
    builtin: gated
  - name: create_ticket
    class: unkeyed_write
    timeout: 1500ms
    lease: 2s
    breaker: {failures: 1000}
    schema:
      type: object
      additionalProperties: false
      required: [title, body]
      properties:
        title: {type: string}
        body: {type: string}
    http: {method: POST, url: "${TOOLQ_SANDBOX_URL}/v1/tickets"}
  - name: search_orders
    class: read
    timeout: 1500ms
    breaker: {failures: 1000}
    schema:
      type: object
      additionalProperties: false
      required: [query]
      properties:
        query: {type: string}
    http: {method: GET, url: "${TOOLQ_SANDBOX_URL}/v1/orders"}
  - name: refused_payment
    class: keyed_write
    timeout: 1s
    lease: 2s
    breaker: {failures: 1000}
    schema: {type: object}
    http: {method: POST, url: "${REFUSED_URL}/v1/payments"}
`

// env is what a test needs: a broker, a ledger, the sandbox, and a client.
type env struct {
	t        *testing.T
	nats     *testenv.NATS
	nc       *nats.Conn
	js       jetstream.JetStream
	client   *jobs.Client
	stack    *embedded.Stack // the connection and the ledger
	store    *ledger.Store
	dbURL    string // empty for SQLite
	dataDir  string
	sandbox  *sandbox.Server
	sbURL    string
	registry *tools.Registry
	logs     *testenv.Buffer
	gate     chan struct{} // holds gated_write calls until closed
	workers  []*runningWorker
	cluster  *testenv.Cluster // with ownCluster
}

type options struct {
	sqlite     bool
	maxDeliver int
	ackWait    time.Duration
	maxBody    int
	faults     sandbox.Faults
	ownCluster bool     // a Postgres cluster of the test's own, which it may stop
	pgSettings []string // that cluster's settings (testenv.OwnCluster)
	durable    string   // default toolq
	filter     string   // default toolq.jobs.>
	inFlight   time.Duration
	meters     metric.MeterProvider          // default: the global one
	propagator propagation.TextMapPropagator // default: the global one
	// transactional adds record_refund, a transactional_write, to the
	// registry (Postgres only), and its refunds table to the database.
	transactional bool
}

func setup(t *testing.T, o options) *env {
	t.Helper()
	e := &env{t: t, logs: &testenv.Buffer{}, dataDir: t.TempDir(), gate: make(chan struct{})}
	e.nats = testenv.StartNATS(t)
	switch {
	case o.ownCluster:
		e.cluster = testenv.OwnCluster(t, o.pgSettings...)
		e.dbURL = e.cluster.Database(t)
	case !o.sqlite:
		e.dbURL = testenv.Postgres(t)
	}
	var err error
	if e.sandbox, err = sandbox.New(sandbox.Config{Faults: o.faults}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.sandbox)
	t.Cleanup(srv.Close)
	e.sbURL = srv.URL
	var extra []string
	if o.transactional {
		createRefunds(t, e.dbURL)
		extra = append(extra, refundToolYAML)
	}
	if e.registry, err = testRegistry(e.sbURL, slog.New(slog.NewTextHandler(e.logs, nil)), e.gate, extra...); err != nil {
		t.Fatal(err)
	}
	// The connection keeps reconnecting across restarts of the server.
	st, err := embedded.Start(context.Background(), embedded.Config{
		NATSURL: e.nats.URL, NATSOptions: []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)},
		DatabaseURL: e.dbURL, Dir: e.dataDir, Tools: e.registry,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	e.stack, e.nc, e.js, e.store = st, st.Conn, st.JS, st.Store
	e.client = jobs.NewClient(e.js)
	if err := jobs.ProvisionStreams(context.Background(), e.js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	return e
}

func refusedURL() string {
	l, _ := netListen()
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// testRegistry loads registryYAML and the tools of extra after it; gate,
// when not nil, holds every call of the gated_write tool until it is
// closed.
func testRegistry(sandboxURL string, logger *slog.Logger, gate chan struct{}, extra ...string) (*tools.Registry, error) {
	refused := refusedURL()
	gated := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return json.RawMessage(`{"ran":true}`), nil
	})
	return tools.Parse([]byte(registryYAML+strings.Join(extra, "")), "test registry", tools.Config{
		Logger: logger,
		Getenv: func(k string) string {
			return map[string]string{"TOOLQ_SANDBOX_URL": sandboxURL, "REFUSED_URL": refused}[k]
		},
		Builtins: map[string]tools.Executor{"gated": gated},
	})
}

func (o options) consumer() worker.Consumer {
	c := worker.Consumer{AckWait: o.ackWait, MaxDeliver: o.maxDeliver, Durable: o.durable, FilterSubject: o.filter}
	if c.AckWait == 0 {
		c.AckWait = 3 * time.Second
	}
	return c
}

type runningWorker struct {
	w      *worker.Worker
	cancel context.CancelFunc
	done   chan error
}

// startWorker runs a worker in this process until the test ends.
func (e *env) startWorker(o options, hook func(worker.FaultPoint, *jobs.Job)) *runningWorker {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := e.stack.NewWorker(ctx, worker.Config{
		Consumer: o.consumer(),
		Owner:    fmt.Sprintf("test-worker-%d", len(e.workers)), BatchSize: 16, RetryDelay: 100 * time.Millisecond,
		MaxBodySize: o.maxBody, ShutdownTimeout: 10 * time.Second, InFlightWait: o.inFlight, Logger: slog.New(slog.NewTextHandler(e.logs, nil)), Test: worker.TestConfig{Hook: hook},
		MeterProvider: o.meters, Propagator: o.propagator,
	})
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	rw := &runningWorker{w: w, cancel: cancel, done: make(chan error, 1)}
	go func() { rw.done <- w.Run(ctx) }()
	e.workers = append(e.workers, rw)
	e.t.Cleanup(func() {
		cancel()
		if err := <-rw.done; err != nil {
			e.t.Errorf("worker: %v", err)
		}
	})
	return rw
}

var seq atomic.Int64

// job returns a valid job for tool with a fresh tool_use_id.
func job(conv string, turn int64, tool, args string) *jobs.Job {
	return &jobs.Job{Version: 1, ConversationID: conv, TurnIndex: turn, Tool: tool,
		ToolUseID: fmt.Sprintf("toolu_%d", seq.Add(1)), Args: json.RawMessage(args)}
}

func payment(invoice string) string {
	return fmt.Sprintf(`{"invoice_id":%q,"amount_cents":500,"currency":"EUR"}`, invoice)
}

func conv(t *testing.T) string {
	return strings.NewReplacer("/", "-", " ", "-", ".", "-", "(", "", ")", "", "^", "", "$", "").Replace(t.Name())
}

func (e *env) publish(j *jobs.Job) jobs.Published {
	e.t.Helper()
	p, err := e.client.Publish(context.Background(), j)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// await waits for the result addressed to j.
func (e *env) await(j *jobs.Job) *jobs.Result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := e.client.Await(ctx, j.ConversationID, j.ToolUseID)
	if err != nil {
		e.t.Fatalf("no result for %s: %v\nlogs:\n%s", j.ToolUseID, err, e.logs.String())
	}
	return r
}

// results returns every result published for the conversation so far.
func (e *env) results(conv string) []*jobs.Result {
	e.t.Helper()
	return readAll(e.t, e.js, jobs.ResultsStream, jobs.ResultSubject(conv), func(m jetstream.Msg) *jobs.Result {
		r, err := jobs.DecodeResult(m.Data())
		if err != nil {
			e.t.Fatalf("bad result: %v", err)
		}
		return r
	})
}

// deadLetters returns every message in the DLQ stream.
func (e *env) deadLetters() []jetstream.Msg {
	e.t.Helper()
	return readAll(e.t, e.js, jobs.DLQStream, jobs.DLQSubjects, func(m jetstream.Msg) jetstream.Msg { return m })
}

func readAll[T any](t *testing.T, js jetstream.JetStream, stream, subject string, conv func(jetstream.Msg) T) []T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	if n == 0 {
		return nil
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	for uint64(len(out)) < n {
		batch, err := cons.Fetch(int(n)-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			out = append(out, conv(m))
			got++
		}
		if got == 0 {
			t.Fatalf("read %d of %d messages from %s", len(out), n, stream)
		}
	}
	return out
}

// consumerInfo returns the durable's state as JetStream sees it.
func (e *env) consumerInfo() *jetstream.ConsumerInfo {
	e.t.Helper()
	c, err := e.js.Consumer(context.Background(), jobs.JobsStream, "toolq")
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return info
}

// settled waits until JetStream has nothing pending or unacknowledged.
func (e *env) settled() *jetstream.ConsumerInfo {
	e.t.Helper()
	var info *jetstream.ConsumerInfo
	testenv.Eventually(e.t, 30*time.Second, "every job acknowledged", func() bool {
		info = e.consumerInfo()
		return info.NumPending == 0 && info.NumAckPending == 0
	})
	return info
}

func (e *env) row(key string) ledger.Row {
	e.t.Helper()
	r, err := e.store.Get(context.Background(), key)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// statsWhen waits until the worker's counts satisfy cond, failing with the
// counts it saw. A delivery is counted when settle has
// answered JetStream, which can come just after its result or dead letter
// is seen.
func statsWhen(t *testing.T, rw *runningWorker, what string, cond func(s map[string]int64) bool) {
	t.Helper()
	var s map[string]int64
	defer func() {
		if !cond(s) {
			t.Logf("%s: stats %v", what, s)
		}
	}()
	testenv.Eventually(t, 10*time.Second, what, func() bool { s = rw.w.Stats().Snapshot(); return cond(s) })
}
