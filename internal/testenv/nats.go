// Package testenv starts the real services toolq's tests run against: an
// in-process nats-server with JetStream per test, and a Postgres database per
// test on a throwaway cluster shared by the test binary (or on the server
// named by TOOLQ_TEST_DATABASE_URL).
//
// A test that cannot get a service skips with a message naming what is
// missing, except when the CI environment variable is set: then it fails.
package testenv

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// NATS is an in-process nats-server with JetStream on a random port and a
// temporary store. Restart stops it and starts a new server on the same port
// and store, as a broker restart would.
type NATS struct {
	t    testing.TB
	opts server.Options
	srv  *server.Server
	// URL is the client URL, stable across restarts.
	URL string
	// StoreDir is the JetStream store, kept across restarts.
	StoreDir string
}

// StartNATS starts a JetStream-enabled server for the test and shuts it down
// when the test ends. Configure, when given, adjusts the options before the
// first start (accounts, authorization, limits).
func StartNATS(t testing.TB, configure ...func(*server.Options)) *NATS {
	t.Helper()
	n := &NATS{t: t, StoreDir: t.TempDir()}
	n.opts = server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  n.StoreDir,
		NoLog:     true,
		NoSigs:    true,
		// Keep JetStream's memory and disk limits small and explicit so that
		// parallel tests do not each reserve a share of the machine.
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  1 << 30,
	}
	for _, c := range configure {
		c(&n.opts)
	}
	n.start()
	t.Cleanup(n.Shutdown)
	return n
}

func (n *NATS) start() {
	n.t.Helper()
	opts := n.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		n.t.Fatalf("testenv: nats-server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(15 * time.Second) {
		srv.Shutdown()
		n.t.Fatalf("testenv: nats-server not ready in 15s")
	}
	n.srv = srv
	addr := srv.Addr().(*net.TCPAddr)
	n.opts.Port = addr.Port // a restart reuses it
	n.URL = "nats://" + net.JoinHostPort(addr.IP.String(), strconv.Itoa(addr.Port))
}

// Server returns the running server.
func (n *NATS) Server() *server.Server { return n.srv }

// Shutdown stops the server and waits until it is down. It is idempotent.
func (n *NATS) Shutdown() {
	if n.srv == nil {
		return
	}
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	n.srv = nil
}

// Restart shuts the server down and starts it again on the same port and
// store, as a broker restart would: streams and consumers survive, clients
// see a disconnect and reconnect.
func (n *NATS) Restart() {
	n.t.Helper()
	n.Shutdown()
	n.start()
}

// Connect opens a client connection that keeps reconnecting across restarts
// and is closed when the test ends.
func (n *NATS) Connect(opts ...nats.Option) *nats.Conn {
	n.t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(n.URL, opts...)
	if err != nil {
		n.t.Fatalf("testenv: connect to %s: %v", n.URL, err)
	}
	n.t.Cleanup(nc.Close)
	return nc
}

// Missing ends a test that lacks a service or a tool: a skip that names
// what is missing, or a failure in CI, where nothing may be skipped.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("testenv: %s (CI is set: a missing service is a failure)", msg)
	}
	t.Skipf("testenv: SKIPPED, %s", msg)
}
