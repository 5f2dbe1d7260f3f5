package inbox

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestTheLoginBackoffGrowsPerClientAndOverall: a client's first few
// failed logins are free; then each waits a backoff that doubles up to a
// most; a success forgets its client's failures, and so does a quiet
// time. Other clients log in meanwhile, until the failures of all
// together pass the overall count.
func TestTheLoginBackoffGrowsPerClientAndOverall(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	th := newThrottle(func() time.Time { return now })
	for i := range perClient.free + 1 {
		if wait := th.attempt("10.0.0.1"); wait != 0 {
			t.Fatalf("login %d waits %s", i+1, wait)
		}
	}
	for _, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second} {
		wait := th.attempt("10.0.0.1")
		if wait != want {
			t.Fatalf("after %d failures: wait %s, want %s", th.clients["10.0.0.1"].failures, wait, want)
		}
		now = now.Add(wait)
		if again := th.attempt("10.0.0.1"); again != 0 {
			t.Fatalf("after waiting %s: %s more", wait, again)
		}
	}
	if wait := th.attempt("10.0.0.2"); wait != 0 {
		t.Fatalf("another client waits %s", wait)
	}
	th.succeeded("10.0.0.2")
	// The backoff is at most perClient.most.
	for range 40 {
		now = now.Add(th.attempt("10.0.0.1"))
		th.attempt("10.0.0.1")
	}
	if wait := th.attempt("10.0.0.1"); wait != perClient.most {
		t.Fatalf("after many failures: %s, want %s", wait, perClient.most)
	}
	// A quiet time forgets them.
	now = now.Add(forgetAfter + perClient.most)
	if wait := th.attempt("10.0.0.1"); wait != 0 {
		t.Fatalf("after a quiet time: %s", wait)
	}
	th.succeeded("10.0.0.1")
	// Failures from many clients slow every client.
	th = newThrottle(func() time.Time { return now })
	for i := range overall.free + 1 {
		if wait := th.attempt(fmt.Sprintf("192.0.2.%d", i)); wait != 0 {
			t.Fatalf("client %d waits %s", i, wait)
		}
	}
	if wait := th.attempt("198.51.100.7"); wait != overall.base {
		t.Fatalf("a new client after %d failures overall waits %s", overall.free+1, wait)
	}
}

func TestAClientIsItsAddressOrItsIPv6Slash64(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"192.0.2.7:4431":              "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:443":  "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:8080": "2001:db8:1:2::/64",
		"[::ffff:192.0.2.7]:1":        "192.0.2.7",
		"@":                           "@",
	} {
		if got := clientOf(&http.Request{RemoteAddr: addr}); got != want {
			t.Errorf("%s: %s, want %s", addr, got, want)
		}
	}
}
