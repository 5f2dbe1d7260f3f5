package embedded_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// certs is a CA and a server certificate it signed, for 127.0.0.1.
func certs(t *testing.T) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "nats"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// startsAtOnce runs Start with a long start-up wait and reports how it
// failed, and whether it waited.
func startsAtOnce(t *testing.T, cfg embedded.Config) (time.Duration, []string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var waited []string
	cfg.StartupWait, cfg.Dir = time.Minute, t.TempDir()
	cfg.Waiting = func(what string) {
		if what != "" {
			waited = append(waited, what)
		}
	}
	start := time.Now()
	st, err := embedded.Start(ctx, cfg)
	if st != nil {
		st.Close()
	}
	return time.Since(start), waited, err
}

// TestRefusalsThatWaitingCannotChangeEndTheStartAtOnce: the start-up wait
// rides out a dependency that is not there yet, never one that refuses the
// consumer's configuration. A NATS server that wants a client certificate,
// a Postgres without TLS asked for sslmode=require, a database or role
// that does not exist: each ends the start at once (TLS refusals were
// waited out for the whole wait, then reported as unavailable).
func TestRefusalsThatWaitingCannotChangeEndTheStartAtOnce(t *testing.T) {
	t.Parallel()
	pool, cert := certs(t)
	mtls := testenv.StartNATS(t, func(o *server.Options) {
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
		o.TLS, o.TLSVerify, o.TLSTimeout = true, true, 2
	})
	plain := testenv.StartNATS(t)
	base := testenv.Postgres(t)
	host := base[:strings.LastIndex(base, "/")]
	for _, c := range []struct {
		name string
		cfg  embedded.Config
	}{
		{"a NATS server that wants a client certificate", embedded.Config{NATSURL: strings.Replace(mtls.URL, "nats://", "tls://", 1),
			NATSOptions: []nats.Option{nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})}}},
		{"sslmode=require against a Postgres without TLS", embedded.Config{NATSURL: plain.URL, DatabaseURL: strings.Replace(base, "sslmode=disable", "sslmode=require", 1)}},
		{"no such database", embedded.Config{NATSURL: plain.URL, DatabaseURL: host + "/no_such_db?sslmode=disable"}},
	} {
		took, waited, err := startsAtOnce(t, c.cfg)
		if err == nil {
			t.Errorf("%s: started", c.name)
			continue
		}
		if took > 10*time.Second || errors.Is(err, embedded.ErrUnavailable) || len(waited) > 0 {
			t.Errorf("%s: waited for as an outage (%v, after %v, waiting for %q)", c.name, err, took.Round(time.Millisecond), waited)
		}
	}
}

// TestStartWaitsForADependencyThatIsNotThereYet: the other side of the
// same wait: nothing listening is waited for, and the error says so.
func TestStartWaitsForADependencyThatIsNotThereYet(t *testing.T) {
	t.Parallel()
	port, _ := testenv.FreePort()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var waited []string
	_, err := embedded.Start(ctx, embedded.Config{NATSURL: fmt.Sprintf("nats://127.0.0.1:%d", port),
		Dir: t.TempDir(), StartupWait: 1500 * time.Millisecond, Waiting: func(what string) { waited = append(waited, what) }})
	if !errors.Is(err, embedded.ErrUnavailable) || len(waited) == 0 || !strings.HasPrefix(waited[0], "NATS at ") {
		t.Fatalf("nothing listening: %v (waiting for %q), want a wait then ErrUnavailable", err, waited)
	}
}
