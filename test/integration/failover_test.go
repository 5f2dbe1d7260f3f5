package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/worker"
)

// The failover test's load: jobs published at this pace, a third of them
// unkeyed writes (create_ticket), the rest keyed (send_payment, each its
// own invoice), each call held downstream for failoverLatency; the primary
// is killed failoverKillAfter into the load.
const (
	failoverJobs      = 150
	failoverPace      = 50 * time.Millisecond
	failoverLatency   = 200 * time.Millisecond
	failoverKillAfter = 2 * time.Second
)

// TestPrimaryFailoverLosesNothingPromised: the ledger is a pg_auto_failover
// formation (a monitor, a primary, a synchronous secondary) reached through
// a multi-host URL with target_session_attrs=read-write. Under load, with
// keyed and unkeyed writes in flight, the primary is killed (SIGKILL to its
// keeper, Postgres and backends); the monitor promotes the secondary and
// the worker reconnects to it. Every job is answered, none is
// dead-lettered, each invoice has one payment (a keyed write whose
// asynchronous claim the failover lost runs again under the same
// Idempotency-Key and the downstream collapses it), and no unkeyed write
// ran twice. The figures (time to recover, jobs that waited, the ledger
// outage the worker counted) are logged.
func TestPrimaryFailoverLosesNothingPromised(t *testing.T) {
	f := testenv.StartFormation(t)
	reader := sdkmetric.NewManualReader()
	o := options{faults: sandbox.Faults{LatencyMS: int(failoverLatency / time.Millisecond)}, meters: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}
	e, ds := setupOnFormation(t, f, o)
	e.startWorker(o, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	type call struct {
		job       *jobs.Job
		published time.Time
		answered  time.Time
		result    *jobs.Result
		err       error
	}
	calls := make([]*call, failoverJobs)
	c := conv(t)
	for i := range calls {
		if i%3 == 2 {
			calls[i] = &call{job: job(c, int64(i), "create_ticket", fmt.Sprintf(`{"title":"failover_%d","body":"unkeyed"}`, i))}
		} else {
			calls[i] = &call{job: job(c, int64(i), "send_payment", payment(fmt.Sprintf("failover_%d", i)))}
		}
	}
	var answers sync.WaitGroup
	start := time.Now()
	killed := make(chan time.Time, 1)
	go func() {
		time.Sleep(failoverKillAfter)
		at := time.Now()
		node, err := f.KillPrimary(ctx)
		if err != nil {
			t.Errorf("killing the primary: %v", err)
		} else {
			t.Logf("killed %s (SIGKILL) %v into the load", f.Nodes[node].Name, at.Sub(start).Round(time.Millisecond))
		}
		killed <- at
	}()
	for i, cl := range calls {
		time.Sleep(time.Until(start.Add(time.Duration(i) * failoverPace)))
		cl.published = time.Now()
		if _, err := e.client.Publish(ctx, cl.job); err != nil {
			t.Fatalf("publish: %v", err)
		}
		answers.Add(1)
		go func() {
			defer answers.Done()
			cl.result, cl.err = e.client.Await(ctx, cl.job.ConversationID, cl.job.ToolUseID)
			cl.answered = time.Now()
		}()
	}
	killAt := <-killed
	// The time to recover: from the kill to the first write through the
	// consumer's URL that commits.
	var recovered time.Time
	for recovered.IsZero() {
		if err := probeWrite(ctx, f.URL()); err == nil {
			recovered = time.Now()
		} else if ctx.Err() != nil {
			t.Fatalf("the formation took no write after the kill:\n%s\n%s", f.State(), f.Logs())
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	answers.Wait()
	lastAnswer := killAt
	var waited, keyedOK, unkeyedOK, unkeyedIndeterminate int
	for _, cl := range calls {
		if cl.err != nil {
			t.Fatalf("no answer for %s (%s): %v\nstate:\n%s\nlogs:\n%s", cl.job.ToolUseID, cl.job.Tool, cl.err, f.State(), e.logs.String())
		}
		if cl.published.Before(recovered) && cl.answered.After(killAt) {
			waited++
		}
		if cl.answered.After(lastAnswer) {
			lastAnswer = cl.answered
		}
		switch {
		case cl.job.Tool == "send_payment" && cl.result.Status == jobs.StatusOK:
			keyedOK++
		case cl.job.Tool == "create_ticket" && cl.result.Status == jobs.StatusOK:
			unkeyedOK++
		case cl.job.Tool == "create_ticket" && cl.result.Status == jobs.StatusIndeterminate:
			unkeyedIndeterminate++
		default:
			t.Errorf("%s (%s): %+v", cl.job.ToolUseID, cl.job.Tool, cl.result)
		}
	}
	if n := len(e.deadLetters()); n != 0 {
		t.Errorf("%d dead letters for a failover", n)
	}
	// One payment per invoice, each under its own key; a key the downstream
	// saw more than once was collapsed into its first payment.
	perInvoice := map[string]int{}
	for _, p := range e.sandbox.Payments() {
		perInvoice[p.InvoiceID]++
	}
	collapsed := 0
	ds.mu.Lock()
	for _, n := range ds.requests {
		if n > 1 {
			collapsed++
		}
	}
	dsReplays := ds.replays
	ds.mu.Unlock()
	for _, cl := range calls {
		if cl.job.Tool != "send_payment" {
			continue
		}
		var a struct {
			InvoiceID string `json:"invoice_id"`
		}
		if err := json.Unmarshal(cl.job.Args, &a); err != nil {
			t.Fatal(err)
		}
		if perInvoice[a.InvoiceID] != 1 {
			t.Errorf("invoice %s: %d payments", a.InvoiceID, perInvoice[a.InvoiceID])
		}
	}
	// No unkeyed write twice: one ticket for each that answered ok, at most
	// one for each left indeterminate.
	perTitle := map[string]int{}
	for _, tk := range e.sandbox.Tickets() {
		perTitle[tk.Title]++
	}
	for i, cl := range calls {
		if cl.job.Tool != "create_ticket" {
			continue
		}
		n := perTitle[fmt.Sprintf("failover_%d", i)]
		if n > 1 || cl.result.Status == jobs.StatusOK && n != 1 {
			t.Errorf("ticket failover_%d: %d tickets for a call answered %s", i, n, cl.result.Status)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var ledgerOutage float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[float64]); ok && m.Name == "toolq.outage.duration" {
				for _, dp := range sum.DataPoints {
					if dep, _ := dp.Attributes.Value("toolq.dependency"); dep.AsString() == "ledger" {
						ledgerOutage += dp.Value
					}
				}
			}
		}
	}
	t.Logf("failover figures: time to recover %v (kill to the first write the new primary committed); "+
		"%d of %d jobs waited through it (published before the recovery, answered after the kill); last answer %v after the kill; "+
		"ledger outage counted by the worker %.1f s (summed over deliveries); "+
		"%d keyed writes ok, %d invoices paid once each, %d key(s) the downstream saw more than once (%d replay(s) collapsed); "+
		"%d unkeyed writes ok, %d indeterminate, none twice; 0 dead letters",
		recovered.Sub(killAt).Round(time.Millisecond), waited, failoverJobs, lastAnswer.Sub(killAt).Round(time.Millisecond),
		ledgerOutage, keyedOK, len(perInvoice), collapsed, dsReplays, unkeyedOK, unkeyedIndeterminate)
	for _, line := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(line, "lost the claim") {
			t.Logf("worker: %s", line)
		}
	}
	t.Log("\n" + f.State())
}

// probeWrite commits a write through url (a fresh connection).
func probeWrite(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS failover_probe (at timestamptz); INSERT INTO failover_probe VALUES (now())")
	return err
}

// downstream counts what reaches the sandbox's payments: the requests by
// Idempotency-Key, and the replays it answered instead of paying again.
type downstream struct {
	mu       sync.Mutex
	requests map[string]int
	replays  int
}

// setupOnFormation is setup with the ledger on the formation, through its
// multi-host URL, and the sandbox's payments counted.
func setupOnFormation(t *testing.T, f *testenv.Formation, o options) (*env, *downstream) {
	t.Helper()
	e := &env{t: t, logs: &testenv.Buffer{}, dataDir: t.TempDir(), gate: make(chan struct{}), dbURL: f.URL()}
	e.nats = testenv.StartNATS(t)
	var err error
	if e.sandbox, err = sandbox.New(sandbox.Config{Faults: o.faults}); err != nil {
		t.Fatal(err)
	}
	// What reaches the downstream: payment requests by Idempotency-Key, and
	// the replays it answered instead of paying again.
	ds := &downstream{requests: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/payments" {
			rec := httptest.NewRecorder()
			e.sandbox.ServeHTTP(rec, r)
			ds.mu.Lock()
			ds.requests[r.Header.Get("Idempotency-Key")]++
			if rec.Header().Get("Idempotent-Replayed") == "true" {
				ds.replays++
			}
			ds.mu.Unlock()
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes())
			return
		}
		e.sandbox.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.sbURL = srv.URL
	if e.registry, err = testRegistry(e.sbURL, slog.New(slog.NewTextHandler(e.logs, nil)), e.gate); err != nil {
		t.Fatal(err)
	}
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
	return e, ds
}

// TestFailoverLosesAKeyedClaim: a keyed write's claim commits without
// waiting for the disk or the synchronous secondary (its key goes
// downstream, which collapses a repeat), so a failover right after it can
// lose it, exactly as a crash can. The primary's WAL senders are held
// (SIGSTOP) and the primary is killed right after the claim, so that the
// claim never reached the secondary. The tool runs on; once the secondary is promoted its
// completion finds no row and publishes nothing; the redelivery
// claims the key again and runs the call again under the same
// Idempotency-Key, which the downstream answers as a replay: one payment,
// two requests, one result.
func TestFailoverLosesAKeyedClaim(t *testing.T) {
	f := testenv.StartFormation(t)
	// The ack wait outlasts the failover: the redelivery comes after the
	// first holder has run the call and found its claim gone.
	o := options{ackWait: 15 * time.Second}
	e, ds := setupOnFormation(t, f, o)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	keyed := job(conv(t), 0, "send_payment", payment("failover_lost_claim"))
	keyedKey, _ := keyed.Key()
	killed := make(chan time.Time, 1)
	var once sync.Once
	e.startWorker(o, func(p worker.FaultPoint, j *jobs.Job) {
		if p != worker.AfterClaim || j.ToolUseID != keyed.ToolUseID {
			return
		}
		// The claim is in the primary's WAL buffers only; the call goes
		// downstream as the primary dies.
		once.Do(func() {
			if _, err := f.KillPrimary(ctx); err != nil {
				t.Errorf("killing the primary: %v", err)
			}
			killed <- time.Now()
		})
	})
	// From now on nothing the primary commits reaches the secondary.
	resume, err := f.HoldReplication(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer resume()
	p := e.publish(keyed)
	at := <-killed
	for probeWrite(ctx, f.URL()) != nil {
		if ctx.Err() != nil {
			t.Fatalf("no write after the failover:\n%s", f.State())
		}
		time.Sleep(50 * time.Millisecond)
	}
	recoveredIn := time.Since(at)
	if r := e.await(keyed); r.Status != jobs.StatusOK || r.Duplicate {
		t.Fatalf("the keyed write after its claim was lost: %+v", r)
	}
	if row := e.row(keyedKey); row.State != ledger.Completed {
		t.Fatalf("row %+v", row)
	}
	if rs := e.results(keyed.ConversationID); len(rs) != 1 {
		t.Fatalf("%d results for one call: %+v", len(rs), rs)
	}
	if pays := e.sandbox.Payments(); len(pays) != 1 || pays[0].IdempotencyKey != p.Key {
		t.Fatalf("payments %+v, want one under %s", pays, p.Key)
	}
	ds.mu.Lock()
	var requests int
	for _, n := range ds.requests {
		requests += n
	}
	replays := ds.replays
	ds.mu.Unlock()
	if requests != 2 || replays != 1 {
		t.Fatalf("the downstream saw %d request(s) and answered %d replay(s), want the call twice and the second collapsed; logs:\n%s", requests, replays, e.logs.String())
	}
	if !strings.Contains(e.logs.String(), "lost the claim while the tool ran") {
		t.Fatalf("the first holder did not see it lost its claim; logs:\n%s", e.logs.String())
	}
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
	t.Logf("the claim lost in the failover (recovered in %v): the downstream saw the key twice and paid once", recoveredIn.Round(time.Millisecond))
}
