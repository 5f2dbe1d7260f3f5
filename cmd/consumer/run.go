package main

import (
	"context"
	"errors"
	"expvar"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	sdklog "go.opentelemetry.io/otel/sdk/log"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/version"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/mcpfront"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/tracing"
	"github.com/toolq/toolq/worker"
)

const runSynopsis = `consumer [run] [flags]

Runs the worker. With no --nats-url it starts an embedded NATS server with JetStream
under --data-dir; with no --database-url the ledger is SQLite under --data-dir; with no
--tools it runs the demo registry against a sandbox API started in-process.`

func runWorker(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("run", runSynopsis, stdio)
	var nf cli.NATSFlags
	nf.Register(fs, getenv, "", "NATS server URL; empty: start an embedded server")
	var sf storeFlags
	sf.register(fs, getenv)
	natsListen := fs.String("nats-listen", "127.0.0.1:4222", "address of the embedded NATS server")
	toolsFile := fs.String("tools", "", "tool registry file; empty: the demo registry and an in-process sandbox")
	sandboxListen := fs.String("sandbox-listen", "127.0.0.1:8089", "address of the in-process sandbox API (demo registry only)")
	workers := fs.Int("workers", 64, "jobs processed at once")
	batch := fs.Int("batch", 32, "jobs fetched per pull (their keys are claimed in one round trip)")
	untilEmpty := fs.Bool("until-empty", false, "exit once nothing is pending and nothing is in flight")
	healthAddr := fs.String("health-addr", "", "serve /healthz, /readyz and /metrics here")
	mcpListen := fs.String("mcp-listen", "", "serve the registry's tools as an MCP server (Streamable HTTP) at /mcp on this address; empty: off")
	var inboxf inboxFlags
	inboxf.register(fs)
	debugPprof := fs.Bool("debug-pprof", false, "also serve Go's profiles under /debug/pprof/ on --health-addr (heap, goroutine, profile), and its memory statistics under /debug/vars")
	cpuProfile := fs.String("debug-cpuprofile", "", "write a CPU profile of this process, from start to exit, to this file (go tool pprof)")
	execTrace := fs.String("debug-trace", "", "write an execution trace of this process, from start to exit, to this file (go tool trace; large at high rates)")
	shutdownTimeout := fs.Duration("shutdown-timeout", 30*time.Second, "on SIGTERM, how long running tools may finish")
	durable := fs.String("durable", "toolq", "name of the durable consumer the workers share")
	filter := fs.String("filter-subject", jobs.JobsSubjects, "the jobs this durable takes, e.g. toolq.jobs.send_payment (give each set of workers with its own registry its own --durable)")
	tenantsFlag := fs.String("tenants", "", "comma-separated tenants served besides the default one (docs/tenants.md): their jobs on toolq.<tenant>.jobs.>, their results, dead letters and approvals in their own streams, their lookups and decisions on their own subjects; empty: a single-tenant deployment")
	ackWait := fs.Duration("ack-wait", 30*time.Second, "JetStream ack wait (the worker sends InProgress while a tool runs)")
	maxDeliver := fs.Int("max-deliver", 10, "deliveries before a job goes to the dead-letter stream")
	maxAckPending := fs.Int("max-ack-pending", 1000, "jobs delivered and not yet acknowledged, across all workers")
	backoff := fs.String("backoff", "", "redelivery delays after an unacknowledged delivery, e.g. 30s,1m,5m (JetStream BackOff; empty: --ack-wait each time)")
	maxBody := fs.Int("max-body-size", 256<<10, "larger jobs go to the dead-letter stream (keep below the server's max payload)")
	replicas := fs.Int("replicas", 1, "stream replicas when creating the streams (3 on a cluster)")
	logFormat := fs.String("log-format", "text", "text or json")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	startupWait := fs.Duration("startup-wait", 5*time.Minute, "how long to wait at start for a NATS server (--nats-url) and a ledger database (--database-url) that cannot be reached yet, retrying with backoff; 0: do not wait")
	if err := cli.BindEnv(fs, getenv, "TOOLQ_"); err != nil {
		return err
	}
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	backoffs, err := parseDurations(*backoff)
	if err != nil {
		return cli.Usagef("--backoff: %w", err)
	}
	if err := inboxf.check(getenv); err != nil {
		return err
	}
	cli.SetServiceGC(getenv)
	stopProfiles, err := startProfiles(*cpuProfile, *execTrace)
	if err != nil {
		return err
	}
	defer stopProfiles()

	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	// Last of all, the logs and metrics providers flush their last records
	// together, within one bounded wait (the spans are flushed by
	// cli.Traced after run returns).
	var flushes []func(context.Context) error
	cleanups = append(cleanups, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cli.FlushTimeout)
		defer cancel()
		var wg sync.WaitGroup
		for _, shutdown := range flushes {
			wg.Go(func() { shutdown(sctx) })
		}
		wg.Wait()
	})
	logs, err := tracing.LoggerProvider(ctx, "toolq-consumer")
	if err != nil {
		return err
	}
	if logs != nil {
		flushes = append(flushes, logs.Shutdown)
	}
	logger, err := newLogger(stdio.Err, *logFormat, *logLevel, logs)
	if err != nil {
		return err
	}
	if mode, unverified := unverifiedTLS(sf.databaseURL, getenv); unverified {
		logger.Warn("the database URL checks no server certificate: whoever answers for its host gets the ledger's password; use sslmode=verify-full with sslrootcert (docs/deploy.md)", "sslmode", mode)
	}
	banner := []string{"toolq consumer"}

	natsOpts, err := nf.Options("toolq consumer")
	if err != nil {
		return err
	}
	ec := embedded.Config{Dir: sf.dataDir, NATSURL: nf.URL, NATSOptions: natsOpts, NATSListen: *natsListen,
		DatabaseURL: sf.databaseURL, SandboxListen: *sandboxListen, Logger: logger}
	if *toolsFile != "" {
		if ec.Tools, err = tools.Load(*toolsFile, tools.Config{Getenv: getenv, Logger: logger}); err != nil {
			return err
		}
		registry := ec.Tools
		cleanups = append(cleanups, func() { registry.Close() }) // after the worker: MCP sessions, stdio servers
	}
	meters, metricsHandler, err := tracing.MeterProvider(ctx, "toolq-consumer")
	if err != nil {
		return err
	}
	flushes = append(flushes, meters.Shutdown)
	// The binary's meter provider is the global one, which libraries use
	// (otelhttp's http.client.* metrics of the HTTP tools).
	otel.SetMeterProvider(meters)
	// Health first: while the start waits for NATS and the ledger, /healthz
	// answers and /readyz says what it waits for.
	var probe readiness
	probe.waiting("NATS and the ledger")
	var healthURL string
	if *healthAddr != "" {
		addr, stop, err := serveHealth(*healthAddr, &probe, metricsHandler, *debugPprof)
		if err != nil {
			return err
		}
		cleanups = append(cleanups, stop)
		healthURL = "http://" + addr
	}
	ec.StartupWait, ec.Waiting = *startupWait, probe.waiting
	st, err := embedded.Start(ctx, ec)
	switch {
	case err != nil && ctx.Err() != nil:
		logger.Info("consumer stopped while it waited to start")
		return nil // SIGTERM while waiting: a stop, not a failure
	case err != nil:
		return flagHint(err)
	}
	cleanups = append(cleanups, st.Close)
	nf.URL = st.NATSURL
	shownURL := embedded.RedactURL(nf.URL) // a password in the URL is shown nowhere
	natsDesc := shownURL
	if st.Server != nil {
		natsDesc = fmt.Sprintf("embedded, %s (JetStream store %s, fsync on every write)", shownURL, filepath.Join(sf.dataDir, "jetstream"))
	}
	banner = append(banner, "  NATS     "+natsDesc)
	banner = append(banner, "  ledger   "+ledgerDesc(st.Store, sf))

	var names []string
	for _, t := range st.Tools.Tools() {
		names = append(names, t.Name+" ("+string(t.Class)+")")
	}
	if *toolsFile == "" {
		banner = append(banner, "  tools    demo registry: "+strings.Join(names, ", "), "  sandbox  "+st.SandboxURL+" (GET /v1/payments lists every payment)")
	} else {
		banner = append(banner, "  tools    "+*toolsFile+": "+strings.Join(names, ", "))
	}

	// Calls awaiting a person's approval are decided through one service:
	// the worker's sweep, the decisions on toolq.decide.<group>.
	tenants, err := parseTenants(*tenantsFlag)
	if err != nil {
		return err
	}
	appr, err := approvals.New(approvals.Config{Ledger: st.Store, JS: st.JS, Logger: logger, MeterProvider: meters, Tenants: tenants})
	if err != nil {
		return err
	}
	w, err := st.NewWorker(ctx, worker.Config{
		Approvals:      appr,
		MeterProvider:  meters,
		TracerProvider: tracing.Provider(),
		Streams:        jobs.Streams{Replicas: *replicas, Tenants: tenants},
		Consumer:       worker.Consumer{Durable: *durable, FilterSubject: *filter, AckWait: *ackWait, MaxDeliver: *maxDeliver, MaxAckPending: *maxAckPending, BackOff: backoffs},
		BatchSize:      *batch, MaxInFlight: *workers, MaxBodySize: *maxBody,
		ShutdownTimeout: *shutdownTimeout, UntilEmpty: *untilEmpty, Logger: logger,
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return nil
	case err != nil:
		return err
	}
	// Agents ask the ledger whether a call already happened over NATS.
	lookup, err := worker.ServeLookup(st.Conn, st.Store, logger, tenants...)
	if err != nil {
		return fmt.Errorf("ledger lookup service: %w", err)
	}
	cleanups = append(cleanups, func() { lookup.Stop() })
	// And read their tool list from the registry that runs their calls.
	toolList, err := worker.ServeTools(st.Conn, st.Tools, logger)
	if err != nil {
		return fmt.Errorf("tool list service: %w", err)
	}
	cleanups = append(cleanups, func() { toolList.Stop() })
	// Approvers decide over NATS, each group on its own subject.
	decisions, err := appr.Serve(st.Conn)
	if err != nil {
		return fmt.Errorf("approvals service: %w", err)
	}
	cleanups = append(cleanups, func() { decisions.Stop() })
	// And in the inbox's web page.
	var inboxURL string
	if inboxf.listen != "" {
		url, stop, err := inboxf.serve(appr, st.Store, st.Conn, logger)
		if err != nil {
			return err
		}
		cleanups = append(cleanups, stop)
		inboxURL = url
		banner = append(banner, "  inbox    "+inboxURL+" ("+inboxf.describe()+")")
	}
	var mcpURL string
	if *mcpListen != "" {
		addr, stop, err := serveMCP(ctx, *mcpListen, mcpfront.Config{Registry: st.Tools, JS: st.JS, Logger: logger, MaxBodySize: *maxBody})
		if err != nil {
			return err
		}
		cleanups = append(cleanups, stop)
		mcpURL = "http://" + addr + "/mcp"
		banner = append(banner, "  mcp      "+mcpURL+" (tools/call with _meta io.toolq/conversation_id and io.toolq/turn_index)")
	}
	// Ready once the worker has its streams and its durable consumer.
	probe.started(st.Conn, st.Store)
	if healthURL != "" {
		banner = append(banner, "  health   "+healthURL+"/healthz, /readyz, /metrics")
	}
	banner = append(banner, "", "Try, in another shell:")
	if *toolsFile == "" {
		banner = append(banner, fmt.Sprintf(`  go run ./cmd/publisher publish --nats-url %s --conversation demo --turn 1 --tool send_payment \
      --args '{"invoice_id":"inv_1","amount_cents":500,"currency":"EUR"}' --wait`, shownURL))
	} else {
		banner = append(banner, fmt.Sprintf("  go run ./cmd/publisher publish --nats-url %s --conversation C --turn 1 --tool T --args '{…}' --wait", shownURL))
	}
	if *logFormat == "json" {
		// Nothing but JSON on standard output: what runs where is a record
		// of the log instead.
		attrs := []any{"version", version.Get().Version, "nats", natsDesc, "ledger", ledgerDesc(st.Store, sf), "tools", strings.Join(names, ", ")}
		if st.SandboxURL != "" {
			attrs = append(attrs, "sandbox", st.SandboxURL)
		}
		if healthURL != "" {
			attrs = append(attrs, "health", healthURL)
		}
		if mcpURL != "" {
			attrs = append(attrs, "mcp", mcpURL)
		}
		if inboxURL != "" {
			attrs = append(attrs, "inbox", inboxURL)
		}
		logger.Info("toolq consumer", attrs...)
	} else {
		fmt.Fprintln(stdio.Out, strings.Join(banner, "\n"))
	}
	logger.Info("consumer started", "durable", *durable)
	err = w.Run(ctx)
	logger.Info("consumer stopped", "stats", w.Stats().Snapshot())
	return err
}

func ledgerDesc(store *ledger.Store, sf storeFlags) string {
	if store.Backend() == "sqlite" {
		return "sqlite " + filepath.Join(sf.dataDir, "ledger.db")
	}
	return "postgres"
}

// flagHint adds to an address that cannot be listened on the flag that
// chooses another.
func flagHint(err error) error {
	var le *embedded.ListenError
	if !errors.As(err, &le) {
		return err
	}
	switch le.Part {
	case embedded.PartNATS:
		return fmt.Errorf("cannot start the embedded NATS server: %w (choose another address with --nats-listen, or connect to a running server with --nats-url)", err)
	case embedded.PartSandbox:
		return fmt.Errorf("%w (choose another address with --sandbox-listen)", err)
	}
	return err
}

// readiness is what /readyz reports: what the start still waits for, then
// whether NATS and the ledger answer.
type readiness struct {
	mu    sync.Mutex
	wait  string
	nc    *nats.Conn
	store *ledger.Store
}

func (p *readiness) waiting(what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wait = what
}

func (p *readiness) started(nc *nats.Conn, store *ledger.Store) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nc, p.store, p.wait = nc, store, ""
}

func (p *readiness) problems(ctx context.Context) []string {
	p.mu.Lock()
	wait, nc, store := p.wait, p.nc, p.store
	p.mu.Unlock()
	switch {
	case wait != "":
		return []string{"starting: waiting for " + wait}
	case nc == nil:
		return []string{"starting"}
	}
	var problems []string
	if nc.Status() != nats.CONNECTED {
		problems = append(problems, "nats: "+nc.Status().String())
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := store.Ping(ctx); err != nil {
		problems = append(problems, err.Error())
	}
	return problems
}

// serveHealth serves liveness, readiness and metrics.
func serveHealth(addr string, probe *readiness, metrics http.Handler, debugPprof bool) (string, func(), error) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, r *http.Request) { fmt.Fprintln(rw, "ok "+version.Get().String()) })
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, r *http.Request) {
		if problems := probe.problems(r.Context()); len(problems) > 0 {
			http.Error(rw, strings.Join(problems, "; "), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(rw, "ready")
	})
	mux.Handle("GET /metrics", metrics)
	if debugPprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
		mux.Handle("GET /debug/vars", expvar.Handler()) // runtime.MemStats: what publisher bench counts a job's allocations by
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--health-addr %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	return l.Addr().String(), func() { srv.Close() }, nil
}

// serveMCP serves the registry's tools as an MCP server at /mcp. From
// ctx's end (SIGTERM) it takes no new connection, while the worker drains
// and the calls in flight get their results; stop, after the worker, ends
// the calls still waiting (their clients are told to send them again) and
// the server.
func serveMCP(ctx context.Context, addr string, cfg mcpfront.Config) (string, func(), error) {
	front, err := mcpfront.New(cfg)
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		front.Close()
		return "", nil, fmt.Errorf("--mcp-listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", front.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	draining := make(chan struct{})
	stopDrain := context.AfterFunc(ctx, func() {
		defer close(draining)
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx) // closes the listener, then waits for idle connections
	})
	return l.Addr().String(), func() {
		if !stopDrain() {
			<-draining
		}
		front.Close()
		srv.Close()
	}, nil
}

// newLogger logs to out, and to logs (OTEL_LOGS_EXPORTER) when it is not
// nil; a line logged while a span is active carries its trace_id and
// span_id.
func newLogger(out io.Writer, format, level string, logs *sdklog.LoggerProvider) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, cli.Usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	const name = "github.com/toolq/toolq/cmd/consumer"
	switch format {
	case "text":
		return tracing.NewLogger(slog.NewTextHandler(out, opts), logs, name), nil
	case "json":
		return tracing.NewLogger(slog.NewJSONHandler(out, opts), logs, name), nil
	}
	return nil, cli.Usagef("--log-format: want text or json")
}

func parseDurations(list string) ([]time.Duration, error) {
	if list == "" {
		return nil, nil
	}
	var out []time.Duration
	for _, part := range strings.Split(list, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(part))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%q is not a positive duration", part)
		}
		out = append(out, d)
	}
	return out, nil
}

// parseTenants reads --tenants: comma-separated tenant names.
func parseTenants(flag string) ([]string, error) {
	var tenants []string
	for _, t := range strings.Split(flag, ",") {
		if t = strings.TrimSpace(t); t == "" {
			continue
		}
		if !jobs.ValidTenant(t) {
			return nil, cli.Usagef("--tenants: %q: a tenant must match ^[A-Za-z0-9_-]{1,64}$ and not be jobs, results, dlq, approvals, decide, ledger or tools", t)
		}
		tenants = append(tenants, t)
	}
	return tenants, nil
}
