package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
)

// TestTheInboxFlagsAreRefusedBeforeAnythingStarts: an inbox needs its
// approvers (a token file, or one operator on a loopback address); its
// other flags need --approvals-listen; each mistake is a usage error that
// says what to give instead, before the consumer starts anything.
func TestTheInboxFlagsAreRefusedBeforeAnythingStarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("approvers: [{name: alice, groups: [finance], token_env: ALICE_TOKEN}]\n"), 0o600)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--approvals-tokens", bad}, "--approvals-listen"},
		{[]string{"--approvals-listen", "127.0.0.1:0"}, "--approvals-tokens FILE"},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-as", "ops-desk"}, "--approvals-groups"},
		{[]string{"--approvals-listen", "0.0.0.0:0", "--approvals-as", "ops-desk", "--approvals-groups", "finance"}, "loopback"},
		{[]string{"--approvals-listen", ":8080", "--approvals-as", "ops-desk", "--approvals-groups", "finance"}, "loopback"},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-as", "ops-desk", "--approvals-groups", "fin.ance"}, `"fin.ance"`},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-tokens", bad, "--approvals-as", "x"}, "not both"},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-tokens", bad}, "ALICE_TOKEN is not set"},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-tokens", filepath.Join(dir, "none.yaml")}, "no such file"},
		{[]string{"--approvals-listen", "127.0.0.1:0", "--approvals-as", "x", "--approvals-groups", "g", "--approvals-tls-cert", "c.pem"}, "go together"},
	} {
		var out, errOut testenv.Buffer
		args := append([]string{"--data-dir", filepath.Join(dir, "data")}, c.args...)
		err := run(context.Background(), args, cli.IO{Out: &out, Err: &errOut}, func(string) string { return "" })
		var ee *cli.ExitError
		if !errors.As(err, &ee) || ee.Code != cli.ExitUsage || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want a usage error saying %q", c.args, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
		t.Error("the consumer started something before refusing its flags")
	}
}

// TestTheInboxServesOverTLSWithASecureCookie: with a certificate the inbox
// is served over HTTPS, the banner says so, and its session cookie is
// Secure; the consumer stops with it.
func TestTheInboxServesOverTLSWithASecureCookie(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := selfSigned(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, logs testenv.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--data-dir", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--sandbox-listen", "127.0.0.1:0",
			"--approvals-listen", "127.0.0.1:0", "--approvals-as", "ops-desk", "--approvals-groups", "finance",
			"--approvals-tls-cert", certFile, "--approvals-tls-key", keyFile}, cli.IO{Out: &out, Err: &logs}, func(string) string { return "" })
	}()
	var url string
	testenv.Eventually(t, 60*time.Second, "the banner", func() bool {
		url = find(out.String(), `inbox\s+(https://\S+/) \(acting as ops-desk for finance`)
		return url != ""
	})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	res, err := client.Get(url + "api/session")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	cookies := res.Cookies()
	if res.StatusCode != http.StatusOK || len(cookies) != 1 || !cookies[0].Secure || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("%d %+v", res.StatusCode, cookies)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consumer: %v\n%s", err, logs.String())
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T, dir string) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return certFile, keyFile
}
