package cli_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
)

// TestNATSFlagsTLS: against a server that requires TLS with client
// certificates, the flags (or NATS_CA, NATS_CERT, NATS_KEY) connect, and a
// client without the CA or without a certificate does not.
func TestNATSFlagsTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caCert, caKey := newCert(t, dir, "ca", nil, nil)
	newCert(t, dir, "server", caCert, caKey)
	newCert(t, dir, "client", caCert, caKey)
	tlsConfig, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem"),
		CaFile: filepath.Join(dir, "ca.pem"), Verify: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	n := testenv.StartNATS(t, func(o *server.Options) { o.TLSConfig = tlsConfig; o.TLS = true; o.TLSVerify = true })
	env := map[string]string{
		"NATS_URL": "tls://" + n.URL[len("nats://"):],
		"NATS_CA":  filepath.Join(dir, "ca.pem"), "NATS_CERT": filepath.Join(dir, "client.pem"), "NATS_KEY": filepath.Join(dir, "client-key.pem"),
	}
	connect := func(env map[string]string) error {
		var f cli.NATSFlags
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		f.Register(fs, func(k string) string { return env[k] }, "", "")
		if err := fs.Parse(nil); err != nil {
			return err
		}
		nc, err := f.Connect("tls test")
		if err == nil {
			nc.Close()
		}
		return err
	}
	if err := connect(env); err != nil {
		t.Fatalf("with CA and client certificate: %v", err)
	}
	without := func(key string) map[string]string {
		m := map[string]string{}
		for k, v := range env {
			if k != key {
				m[k] = v
			}
		}
		return m
	}
	if err := connect(without("NATS_CA")); err == nil {
		t.Fatal("connected without trusting the server's CA")
	}
	noCert := without("NATS_CERT")
	delete(noCert, "NATS_KEY")
	if err := connect(noCert); err == nil {
		t.Fatal("connected without a client certificate")
	}
	if err := connect(without("NATS_KEY")); err == nil {
		t.Fatal("a certificate without its key was accepted")
	}
}

// newCert writes name.pem and name-key.pem, signed by the parent (self-signed
// CA when parent is nil), valid for 127.0.0.1.
func newCert(t *testing.T, dir, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "toolq test " + name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	signer, signerKey := tmpl, key
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	} else {
		signer, signerKey = parent, parentKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	os.WriteFile(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(filepath.Join(dir, name+"-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}
