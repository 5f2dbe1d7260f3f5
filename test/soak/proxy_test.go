package soak

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echo serves lines back until the connection closes.
func echo(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return l.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err == nil && line != "ping\n" {
		return errors.New("echoed " + line)
	}
	return err
}

func TestProxy(t *testing.T) {
	t.Parallel()
	p, err := NewProxy("echo", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	c, r := dial()
	if err := roundTrip(c, r, time.Second); err != nil {
		t.Fatalf("forwarding: %v", err)
	}

	p.SetLatency(150 * time.Millisecond)
	began := time.Now()
	if err := roundTrip(c, r, 2*time.Second); err != nil {
		t.Fatalf("with latency: %v", err)
	}
	if d := time.Since(began); d < 300*time.Millisecond {
		t.Fatalf("a round trip with 150ms each way took %v", d)
	}
	p.SetLatency(0)

	// A black hole holds what is sent, on open and on new connections,
	// and forwards it when healed.
	p.BlackHole()
	if err := roundTrip(c, r, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("black-holed: want a timeout, got %v", err)
	}
	fresh, freshR := dial()
	if err := roundTrip(fresh, freshR, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection while black-holed: want a timeout, got %v", err)
	}
	p.Heal()
	fresh.SetDeadline(time.Now().Add(time.Second))
	if line, err := freshR.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("after the heal, the held ping: %q, %v", line, err)
	}
	c.SetDeadline(time.Now().Add(time.Second))
	if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("after the heal, the ping held on the open connection: %q, %v", line, err)
	}

	// A reset ends open connections; new ones work.
	if n := p.Reset(); n == 0 {
		t.Fatal("reset closed no connection")
	}
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("a reset connection still reads")
	}
	c2, r2 := dial()
	if err := roundTrip(c2, r2, time.Second); err != nil {
		t.Fatalf("after a reset: %v", err)
	}
}
