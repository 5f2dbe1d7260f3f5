package ledger_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/ledger"
)

// impostorPostgres is a server that answers Postgres's SSLRequest with a
// certificate of an authority nobody trusts, asks the client for its
// password in clear (inside that TLS) and sends what it got on got.
func impostorPostgres(t *testing.T) (addr string, got <-chan string) {
	t.Helper()
	certs := testenv.NewCerts(t, "impostor")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ch := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var req [8]byte
		if _, err := io.ReadFull(c, req[:]); err != nil || binary.BigEndian.Uint32(req[4:]) != 80877103 {
			return
		}
		c.Write([]byte{'S'})
		tc := tls.Server(c, certs.ServerTLS(t, false))
		if err := tc.Handshake(); err != nil {
			return
		}
		r := bufio.NewReader(tc)
		var n [4]byte
		io.ReadFull(r, n[:])
		io.CopyN(io.Discard, r, int64(binary.BigEndian.Uint32(n[:]))-4) // the startup message
		tc.Write([]byte{'R', 0, 0, 0, 8, 0, 0, 0, 3})                   // AuthenticationCleartextPassword
		kind, _ := r.ReadByte()
		io.ReadFull(r, n[:])
		body := make([]byte, binary.BigEndian.Uint32(n[:])-4)
		io.ReadFull(r, body)
		if kind == 'p' {
			ch <- strings.TrimRight(string(body), "\x00")
		}
	}()
	return l.Addr().String(), ch
}

// docs/deploy.md's DATABASE_URL (sslmode=verify-full, sslrootcert naming
// the database's authority) refuses a server whose certificate another
// authority signed before any password is sent; sslmode=require, which
// checks no certificate, sends it to that server, as docs/deploy.md warns.
func TestTheDeployGuidesDatabaseURLGivesNoPasswordToAnImpostor(t *testing.T) {
	t.Parallel()
	ours := testenv.NewCerts(t, "database")
	for _, tc := range []struct {
		name, query string
		sent        bool
	}{
		{"verify-full with our authority", "sslmode=verify-full&sslrootcert=" + ours.CA, false},
		{"require", "sslmode=require", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr, got := impostorPostgres(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := ledger.OpenPostgres(ctx, fmt.Sprintf("postgres://toolq:db-PASSWORD-5ecret@%s/toolq?connect_timeout=3&%s", addr, tc.query))
			if err == nil {
				s.Ping(ctx)
				s.Close()
			}
			select {
			case pw := <-got:
				if !tc.sent {
					t.Errorf("a server whose certificate no authority of ours signed was sent the password %q", pw)
				}
			case <-time.After(3 * time.Second):
				if tc.sent {
					t.Error("the impostor was sent no password: it cannot tell a URL that protects it from one that does not")
				}
			}
		})
	}
}
