package testenv

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

// PublishRaw publishes body with the header lines on subject by speaking
// the NATS protocol itself, as a client other than nats.go may: nats.go
// refuses to send some header names (with a space, a slash, a
// non-ASCII byte) that the server stores and delivers. Each line is
// "Name: value", without its CRLF. It returns once the server has
// processed the message (a PING answered), and fails the test on any
// error.
func PublishRaw(t testing.TB, serverURL, subject string, lines []string, body []byte) {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("raw publish: no INFO from the server: %q %v", line, err)
	}
	header := "NATS/1.0\r\n" + strings.Join(lines, "\r\n") + "\r\n\r\n"
	msg := fmt.Sprintf("CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1}\r\nHPUB %s %d %d\r\n%s%s\r\nPING\r\n",
		subject, len(header), len(header)+len(body), header, body)
	if _, err := conn.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("raw publish: %v", err)
		}
		switch {
		case strings.HasPrefix(line, "PONG"):
			return
		case strings.HasPrefix(line, "-ERR"):
			t.Fatalf("raw publish: %s", strings.TrimSpace(line))
		}
	}
}
