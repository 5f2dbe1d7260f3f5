package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Certs are a certificate authority made for one test and the certificates
// it signed, as PEM files in Dir: a server's, for 127.0.0.1 and localhost,
// and a client's. Each file is readable by its owner alone.
type Certs struct {
	Dir        string
	CA         string // the authority's certificate
	ServerCert string
	ServerKey  string
	ClientCert string // its subject's common name is "toolq"
	ClientKey  string
	// Pool holds the authority, for a tls.Config's RootCAs or ClientCAs.
	Pool *x509.CertPool
}

// NewCerts makes an authority (named name, so that two in one test are told
// apart) and its server and client certificates, valid for an hour, in a
// new temporary directory.
func NewCerts(t testing.TB, name string) *Certs {
	t.Helper()
	c := &Certs{Dir: t.TempDir(), Pool: x509.NewCertPool()}
	caKey, caDER := mustCert(t, &x509.Certificate{
		Subject:               pkix.Name{CommonName: name + " test CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}, nil, nil)
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	c.Pool.AddCert(ca)
	c.CA = c.write(t, "ca.pem", "CERTIFICATE", caDER)
	for _, leaf := range []struct {
		cert, key *string
		tmpl      *x509.Certificate
	}{
		{&c.ServerCert, &c.ServerKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "localhost"},
			DNSNames:    []string{"localhost"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}},
		{&c.ClientCert, &c.ClientKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "toolq"},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
	} {
		key, der := mustCert(t, leaf.tmpl, ca, caKey)
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		base := "server"
		if leaf.cert == &c.ClientCert {
			base = "client"
		}
		*leaf.cert = c.write(t, base+".pem", "CERTIFICATE", der)
		*leaf.key = c.write(t, base+"-key.pem", "PRIVATE KEY", keyDER)
	}
	return c
}

// ServerTLS is the server's tls.Config; with clientCerts, a client must
// present a certificate of the authority.
func (c *Certs) ServerTLS(t testing.TB, clientCerts bool) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(c.ServerCert, c.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if clientCerts {
		cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, c.Pool
	}
	return cfg
}

func (c *Certs) write(t testing.TB, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(c.Dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

var serial = big.NewInt(time.Now().UnixNano())

// mustCert makes a key and a certificate of tmpl for it, signed by parent
// (nil: by itself).
func mustCert(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = new(big.Int).Add(serial, big.NewInt(time.Now().UnixNano()))
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

// EnableTLS turns TLS on in the running cluster with the server certificate
// of certs (copied into the cluster's directory, owned by the server's
// user, as Postgres wants its key), and has it refuse connections without
// TLS over TCP: ssl=on, then a reload. Connect with URLTLS: URL and
// Database, which do not use TLS, no longer connect.
func (c *Cluster) EnableTLS(t testing.TB, certs *Certs) {
	t.Helper()
	for _, f := range []struct{ from, to string }{{certs.ServerCert, "server.crt"}, {certs.ServerKey, "server.key"}} {
		data, err := os.ReadFile(f.from)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(c.dir, f.to)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if c.cred != nil {
			if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Only TLS over TCP; the socket in the cluster's directory stays open
	// without it, for the harness.
	hba := "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n"
	if err := os.WriteFile(filepath.Join(c.dataDir(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	if c.cred != nil {
		os.Chown(filepath.Join(c.dataDir(), "pg_hba.conf"), int(c.cred.Uid), int(c.cred.Gid))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("testenv: enable TLS: %v", err)
	}
	defer conn.Close(context.Background())
	for _, stmt := range []string{
		fmt.Sprintf("ALTER SYSTEM SET ssl_cert_file = '%s'", filepath.Join(c.dir, "server.crt")),
		fmt.Sprintf("ALTER SYSTEM SET ssl_key_file = '%s'", filepath.Join(c.dir, "server.key")),
		"ALTER SYSTEM SET ssl = on",
		"SELECT pg_reload_conf()",
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("testenv: enable TLS: %s: %v", stmt, err)
		}
	}
	// The reload is asynchronous: wait until a connection gets TLS.
	Eventually(t, 30*time.Second, "Postgres to accept TLS", func() bool {
		conn, err := pgx.Connect(ctx, c.URLTLS("postgres", certs.CA))
		if err != nil {
			return false
		}
		conn.Close(ctx)
		return true
	})
}

// URLTLS is the URL of a database on the cluster over TLS, the server's
// certificate verified against the authority in the file ca and its name
// against the host (sslmode=verify-full).
func (c *Cluster) URLTLS(database, ca string) string {
	return fmt.Sprintf("postgres://postgres@localhost:%d/%s?sslmode=verify-full&sslrootcert=%s", c.Port, database, ca)
}
