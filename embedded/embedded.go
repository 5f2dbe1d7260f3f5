// Package embedded assembles toolq in one process: a NATS server with
// JetStream, a SQLite ledger, and the demo registry against an in-process
// sandbox API, ready for a worker. Each part can be replaced by a running
// one (a NATS URL, a Postgres URL, a registry of the caller's), so the
// consumer, `publisher simulate`, the examples and the tests build their
// stack here, in one way.
//
//	st, err := embedded.Start(ctx, embedded.Config{})
//	defer st.Close()
//	w, err := st.StartWorker(ctx, worker.Config{})
//	client := jobs.NewClient(st.JS)
package embedded

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/demo"
	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// Config says which parts to start and where. The zero value starts every
// part in a temporary directory, on free ports of 127.0.0.1.
type Config struct {
	// Dir holds the JetStream store (Dir/jetstream), the SQLite ledger
	// (Dir/ledger.db) and the sandbox's effects (Dir/sandbox.json). With Dir
	// set, the server syncs every write to disk and the sandbox persists
	// its effects, so that a restart on the same Dir finds them; empty: a
	// temporary directory, removed by Close, and neither.
	Dir string

	// NATSURL connects to a running server instead of starting one.
	NATSURL string
	// NATSOptions are the options of the connection (auth, TLS, name).
	NATSOptions []nats.Option
	// NATSListen is the address of the embedded server (host:port; empty:
	// 127.0.0.1 on a free port). Unused with NATSURL.
	NATSListen string

	// DatabaseURL opens the ledger there (see ledger.Open); empty: SQLite
	// under Dir. The schema is migrated either way.
	DatabaseURL string

	// Tools is the registry; nil: the demo registry (package demo) against
	// a sandbox API started in this process.
	Tools *tools.Registry
	// SandboxListen is the address of the sandbox (host:port; empty:
	// 127.0.0.1 on a free port). Unused with Tools.
	SandboxListen string
	// SandboxFaults make the sandbox misbehave from the start.
	SandboxFaults sandbox.Faults
	// Logger receives the demo registry's breaker state changes and what
	// the start waits for (nil: slog.Default()).
	Logger *slog.Logger

	// StartupWait is how long Start waits for a NATS server (NATSURL) and a
	// ledger database that cannot be reached yet, trying again with backoff
	// and logging what it waits for; 0: it does not wait. A refusal that
	// waiting cannot change (bad credentials, a malformed URL) ends the
	// wait at once. When the wait ends unanswered the error wraps
	// ErrUnavailable.
	StartupWait time.Duration
	// Waiting, when not nil, is told what Start waits for ("" once it is
	// done), so that a readiness probe can say it.
	Waiting func(what string)
}

// ErrUnavailable wraps the error of a dependency (NATS, the ledger) that
// could not be reached within Config.StartupWait.
var ErrUnavailable = errors.New("unavailable")

// Part names what a ListenError is about.
type Part string

// The parts that listen on an address.
const (
	PartNATS    Part = "nats"
	PartSandbox Part = "sandbox"
)

// ListenError says that a part could not listen on its address: the address
// is malformed or in use.
type ListenError struct {
	Part Part
	Addr string
	Err  error
}

func (e *ListenError) Error() string {
	return fmt.Sprintf("embedded: %s on %s: %v", e.Part, e.Addr, e.Err)
}

func (e *ListenError) Unwrap() error { return e.Err }

// Stack is a started assembly. Its fields are set by Start and must not be
// changed; Close stops everything Start started.
type Stack struct {
	// Server is the embedded NATS server; nil with Config.NATSURL.
	Server *server.Server
	// NATSURL is the URL the connection was made to.
	NATSURL string
	Conn    *nats.Conn
	JS      jetstream.JetStream
	Store   *ledger.Store
	Tools   *tools.Registry
	// Sandbox and SandboxURL are the in-process sandbox API; nil and empty
	// with Config.Tools.
	Sandbox    *sandbox.Server
	SandboxURL string
	// Dir is Config.Dir, or the temporary directory in its place.
	Dir string

	tempDir     bool
	stopSandbox func(context.Context) error
	closeOnce   sync.Once
	mu          sync.Mutex
	workers     []func()
}

// Start starts the parts cfg asks for and connects them. On error, what was
// started is stopped again; an address that cannot be listened on gives a
// *ListenError.
func Start(ctx context.Context, cfg Config) (st *Stack, err error) {
	st = &Stack{Dir: cfg.Dir, Tools: cfg.Tools}
	defer func() {
		if err != nil {
			st.Close()
			st = nil
		}
	}()
	if st.Dir == "" {
		if st.Dir, err = os.MkdirTemp("", "toolq-embedded-"); err != nil {
			return st, fmt.Errorf("embedded: %w", err)
		}
		st.tempDir = true
	}
	persistent := !st.tempDir

	st.NATSURL = cfg.NATSURL
	if st.NATSURL == "" {
		if st.Server, err = startNATS(cfg.NATSListen, filepath.Join(st.Dir, "jetstream"), persistent); err != nil {
			return st, err
		}
		st.NATSURL = st.Server.ClientURL()
	}
	what := "NATS at " + RedactURL(st.NATSURL)
	err = cfg.wait(ctx, what, func() (err error) {
		st.Conn, err = nats.Connect(st.NATSURL, cfg.NATSOptions...)
		return err
	}, natsUnreachable)
	if err != nil {
		return st, fmt.Errorf("connect to %s: %w", what, err)
	}
	if st.JS, err = jetstream.New(st.Conn); err != nil {
		return st, fmt.Errorf("embedded: %w", err)
	}
	// A server of a JetStream cluster whose peers are not up yet takes
	// connections but answers no JetStream request until the cluster has a
	// leader: wait for JetStream itself.
	err = cfg.wait(ctx, "JetStream at "+RedactURL(st.NATSURL), func() error {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := st.JS.AccountInfo(actx)
		return err
	}, jetStreamUnavailable)
	if err != nil {
		return st, fmt.Errorf("JetStream at %s: %w", RedactURL(st.NATSURL), err)
	}

	if st.Store, err = ledger.Open(ctx, cfg.DatabaseURL, st.Dir); err != nil {
		return st, err
	}
	if err := cfg.wait(ctx, "the ledger database", func() error { return st.Store.Migrate(ctx) },
		func(err error) bool { return errors.Is(err, ledger.ErrUnavailable) }); err != nil {
		return st, err
	}
	if cfg.Waiting != nil {
		cfg.Waiting("")
	}

	if st.Tools == nil {
		sc := sandbox.Config{Faults: cfg.SandboxFaults}
		if persistent {
			sc.StatePath = filepath.Join(st.Dir, "sandbox.json")
		}
		if st.Sandbox, err = sandbox.New(sc); err != nil {
			return st, err
		}
		addr := cfg.SandboxListen
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		if st.SandboxURL, st.stopSandbox, err = st.Sandbox.Listen(addr); err != nil {
			if cause := errors.Unwrap(err); cause != nil {
				err = cause // the sandbox's own prefix says less than ListenError
			}
			return st, &ListenError{Part: PartSandbox, Addr: addr, Err: err}
		}
		if st.Tools, err = demo.Registry(st.SandboxURL, tools.Config{Logger: cfg.Logger}); err != nil {
			return st, err
		}
	}
	return st, nil
}

// wait runs try until it succeeds, fails in a way unreachable does not
// call an outage, or StartupWait ends (then the error wraps
// ErrUnavailable), backing off from 250 ms to 10 s and logging each wait.
func (cfg *Config) wait(ctx context.Context, what string, try func() error, unreachable func(error) bool) error {
	deadline := time.Now().Add(cfg.StartupWait)
	delay := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := try()
		if err == nil || !unreachable(err) {
			return err
		}
		if cfg.StartupWait <= 0 {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if time.Now().Add(delay).After(deadline) {
			return fmt.Errorf("%w: gave up after %v: %w", ErrUnavailable, cfg.StartupWait, err)
		}
		if cfg.Waiting != nil {
			cfg.Waiting(what)
		}
		cfg.logger().Warn("waiting for "+what, "attempt", attempt, "retry_in", delay, "error", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(delay*2, 10*time.Second)
	}
}

func (cfg *Config) logger() *slog.Logger {
	if cfg.Logger != nil {
		return cfg.Logger
	}
	return slog.Default()
}

// natsUnreachable reports a connection to NATS that failed for want of a
// server (refused, no route, a name not resolved, a timeout), as opposed
// to one refused by the server (credentials, TLS: waiting changes nothing).
func natsUnreachable(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	var ne net.Error
	var alert tls.AlertError
	var record tls.RecordHeaderError
	var verify *tls.CertificateVerificationError
	switch {
	case errors.As(err, &alert), errors.As(err, &record), errors.As(err, &verify), errors.Is(err, nats.ErrAuthorization),
		strings.Contains(err.Error(), "tls:"), strings.Contains(err.Error(), "x509:"):
		return false
	case errors.Is(err, nats.ErrNoServers), errors.Is(err, nats.ErrTimeout), errors.As(err, &dns):
		return true
	case errors.As(err, &op):
		return op.Op == "dial"
	}
	return errors.As(err, &ne) && ne.Timeout()
}

// jetStreamUnavailable reports a JetStream that does not answer yet (no
// leader: a timeout, or "temporarily unavailable"), as opposed to one that
// is not enabled, which waiting does not change.
func jetStreamUnavailable(err error) bool {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.Code == 503
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders)
}

// startNATS starts a server with JetStream on addr, storing under dir; with
// sync, every write is synced to disk before it is acknowledged.
func startNATS(addr, dir string, sync bool) (*server.Server, error) {
	host, port := "127.0.0.1", server.RANDOM_PORT
	if addr != "" {
		h, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, &ListenError{Part: PartNATS, Addr: addr, Err: err}
		}
		// Listening first tells an address in use from other failures.
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, &ListenError{Part: PartNATS, Addr: addr, Err: err}
		}
		host, port = h, l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "toolq-embedded", Host: host, Port: port, JetStream: true, StoreDir: dir,
		SyncAlways: sync, NoSigs: true, NoLog: true, MaxPayload: 1 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(15 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS server did not start on %s:%d", host, port)
	}
	return srv, nil
}

// NewWorker returns a worker on the stack: cfg's JS, Ledger and Tools, when
// nil, are the stack's. Everything else in cfg is the caller's (the fault
// hook of a test included). Errors are those of worker.New.
func (s *Stack) NewWorker(ctx context.Context, cfg worker.Config) (*worker.Worker, error) {
	if cfg.JS == nil {
		cfg.JS = s.JS
	}
	if cfg.Ledger == nil {
		cfg.Ledger = s.Store
	}
	if cfg.Tools == nil {
		cfg.Tools = s.Tools
	}
	return worker.New(ctx, cfg)
}

// StartWorker is NewWorker, then Run in the background until Close, which
// stops the worker (draining it) before anything else. The worker runs
// under a context that keeps ctx's values but not its end.
func (s *Stack) StartWorker(ctx context.Context, cfg worker.Config) (*worker.Worker, error) {
	w, err := s.NewWorker(ctx, cfg)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { w.Run(wctx); close(done) }()
	s.mu.Lock()
	s.workers = append(s.workers, func() { cancel(); <-done })
	s.mu.Unlock()
	return w, nil
}

// Close stops the workers StartWorker started, then the sandbox, the
// ledger, the connection (after flushing what it still has to send) and the
// server, and removes a temporary Dir. It is idempotent.
func (s *Stack) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		workers := s.workers
		s.mu.Unlock()
		for i := len(workers) - 1; i >= 0; i-- {
			workers[i]()
		}
		if s.stopSandbox != nil {
			s.stopSandbox(context.Background())
		}
		if s.Store != nil {
			s.Store.Close()
		}
		if s.Conn != nil {
			// The last acks are fire-and-forget publishes: flush them first.
			s.Conn.FlushTimeout(5 * time.Second)
			s.Conn.Close()
		}
		if s.Server != nil {
			s.Server.Shutdown()
			s.Server.WaitForShutdown()
		}
		if s.tempDir {
			os.RemoveAll(s.Dir)
		}
	})
}

// RedactURL is urls (a URL, or a comma-separated list as NATS takes) for
// showing: the password of each replaced by "redacted", and a user alone
// (a NATS token) too. A part that does not parse is kept whole only if it
// has no userinfo.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err != nil && strings.Contains(p, "@"):
			parts[i] = "redacted"
		case err != nil || u.User == nil:
		case hasPassword(u.User):
			u.User = url.UserPassword(u.User.Username(), "redacted")
			parts[i] = u.String()
		default:
			u.User = url.User("redacted")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}

func hasPassword(u *url.Userinfo) bool {
	_, ok := u.Password()
	return ok
}
