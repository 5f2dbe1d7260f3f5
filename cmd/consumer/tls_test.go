package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// tlsSetup is a Postgres cluster that takes TLS alone and a nats-server
// that takes TLS with a client certificate alone, both with certificates
// of an authority made for the test.
type tlsSetup struct {
	certs *testenv.Certs
	pg    *testenv.Cluster
	nats  *testenv.NATS
}

func setupTLS(t *testing.T) tlsSetup {
	t.Helper()
	s := tlsSetup{certs: testenv.NewCerts(t, "toolq")}
	s.pg = testenv.OwnCluster(t)
	s.pg.EnableTLS(t, s.certs)
	s.nats = testenv.StartNATS(t, func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSConfig, o.TLSTimeout = true, true, s.certs.ServerTLS(t, true), 5
	})
	return s
}

// consumerArgs are the flags of a consumer of the setup, whose ledger
// verifies Postgres against ca and NATS against natsCA.
func (s tlsSetup) consumerArgs(t *testing.T, ca, natsCA string) []string {
	return []string{"--nats-url", s.nats.URL, "--nats-ca", natsCA, "--nats-cert", s.certs.ClientCert, "--nats-key", s.certs.ClientKey,
		"--database-url", s.pg.URLTLS("postgres", ca), "--data-dir", t.TempDir(), "--sandbox-listen", "127.0.0.1:0",
		"--startup-wait", "0"}
}

// TestConsumerRunsAJobOverVerifiedTLS: a consumer whose ledger is on a
// Postgres that takes TLS alone (sslmode=verify-full, the authority in
// sslrootcert) and whose NATS wants a client certificate (--nats-ca,
// --nats-cert, --nats-key) runs a job, and its call is in the ledger.
func TestConsumerRunsAJobOverVerifiedTLS(t *testing.T) {
	t.Parallel()
	s := setupTLS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Neither takes a client without TLS, or without a certificate.
	if conn, err := pgx.Connect(ctx, s.pg.URL("postgres")); err == nil {
		conn.Close(ctx)
		t.Fatal("Postgres took a connection without TLS")
	}
	if nc, err := nats.Connect(s.nats.URL, nats.RootCAs(s.certs.CA)); err == nil {
		nc.Close()
		t.Fatal("NATS took a client without a certificate")
	}

	runCtx, stop := context.WithCancel(ctx)
	var out, logs testenv.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, s.consumerArgs(t, s.certs.CA, s.certs.CA), cli.IO{Out: &out, Err: &logs}, func(string) string { return "" })
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v\n%s", err, logs.String())
		}
	}()
	testenv.Eventually(t, time.Minute, "the consumer to start", func() bool {
		return strings.Contains(out.String(), "ledger   postgres")
	})

	nc, err := nats.Connect(s.nats.URL, nats.RootCAs(s.certs.CA), nats.ClientCert(s.certs.ClientCert, s.certs.ClientKey))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	client := jobs.NewClient(js)
	j := &jobs.Job{ConversationID: "tls", TurnIndex: 1, Tool: "send_payment", ToolUseID: "toolu_tls",
		Args: json.RawMessage(`{"invoice_id":"inv_tls","amount_cents":100,"currency":"EUR"}`)}
	if _, err := client.Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	r, err := client.Await(ctx, "tls", "toolu_tls")
	if err != nil || r.Status != jobs.StatusOK {
		t.Fatalf("result %+v %v\n%s", r, err, logs.String())
	}
	conn, err := pgx.Connect(ctx, s.pg.URLTLS("postgres", s.certs.CA))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var rows, tlsBackends int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM toolq_ledger WHERE conversation_id = 'tls'").Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("ledger rows of the call: %d %v", rows, err)
	}
	// The consumer's own connections are there, over TLS.
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
		WHERE s.ssl AND a.pid <> pg_backend_pid() AND a.datname = 'postgres'`).Scan(&tlsBackends); err != nil || tlsBackends == 0 {
		t.Fatalf("the consumer's TLS connections: %d %v", tlsBackends, err)
	}
}

// TestConsumerRefusesAServerItsAuthorityDidNotSign: given another
// authority's certificate, the consumer stops at once and says that the
// server's certificate is not one it trusts, for Postgres and for NATS.
func TestConsumerRefusesAServerItsAuthorityDidNotSign(t *testing.T) {
	t.Parallel()
	s := setupTLS(t)
	other := testenv.NewCerts(t, "other")
	for _, tc := range []struct {
		name       string
		pgCA, nCA  string
		wantInText []string
	}{
		{"postgres", other.CA, s.certs.CA, []string{"ledger", "certificate signed by unknown authority"}},
		{"nats", s.certs.CA, other.CA, []string{"NATS", "certificate signed by unknown authority"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out, logs testenv.Buffer
			err := run(ctx, s.consumerArgs(t, tc.pgCA, tc.nCA), cli.IO{Out: &out, Err: &logs}, func(string) string { return "" })
			if err == nil {
				t.Fatal("the consumer ran")
			}
			t.Log(err)
			for _, w := range tc.wantInText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestNATSPasswordInTheURLIsShownNowhere: a consumer given its NATS
// password in --nats-url shows the URL in its summary and its errors with
// the password redacted.
func TestNATSPasswordInTheURLIsShownNowhere(t *testing.T) {
	t.Parallel()
	const password = "nats-pw-5ecret"
	n := testenv.StartNATS(t, func(o *server.Options) { o.Username, o.Password = "toolq", password })
	host := strings.TrimPrefix(n.URL, "nats://")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Refused: another password.
	var out, logs testenv.Buffer
	err := run(ctx, []string{"--nats-url", "nats://toolq:wrong-" + password + "@" + host, "--data-dir", t.TempDir(),
		"--sandbox-listen", "127.0.0.1:0", "--startup-wait", "0"}, cli.IO{Out: &out, Err: &logs}, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "nats://toolq:redacted@"+host) {
		t.Fatalf("err = %v, want it to name the URL, redacted", err)
	}
	for where, text := range map[string]string{"error": err.Error(), "output": out.String(), "logs": logs.String()} {
		if strings.Contains(text, password) {
			t.Errorf("%s shows the password: %s", where, text)
		}
	}

	// Running: the summary names the server, not the password.
	runCtx, stop := context.WithCancel(ctx)
	var runOut, runLogs testenv.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"--nats-url", "nats://toolq:" + password + "@" + host, "--data-dir", t.TempDir(),
			"--sandbox-listen", "127.0.0.1:0"}, cli.IO{Out: &runOut, Err: &runLogs}, func(string) string { return "" })
	}()
	testenv.Eventually(t, time.Minute, "the summary", func() bool { return strings.Contains(runOut.String(), "Try, in another shell") })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(runOut.String(), "nats://toolq:redacted@"+host) {
		t.Errorf("the summary does not name the server:\n%s", runOut.String())
	}
	for where, text := range map[string]string{"output": runOut.String(), "logs": runLogs.String()} {
		if strings.Contains(text, password) {
			t.Errorf("%s shows the password: %s", where, text)
		}
	}
}
