package inbox

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// A token is a secret to be guessed, and the login is where guessing is
// slowed. Every login counts as a failure of its client until it succeeds:
// past a few failures from one client (an address; an IPv6 address's /64),
// each further login waits a backoff that doubles with every failure, and
// the failures of all clients together do the same past a higher count,
// so that guesses spread over many addresses are slowed too. A success
// forgets its client's failures; failures are forgotten after a quiet
// time without one. The overall backoff can keep an approver out while
// someone guesses (at most maxOverall at a time): a token cannot be
// guessed without it, once the guesses come from enough addresses.
type throttle struct {
	mu      sync.Mutex
	now     func() time.Time
	clients map[string]*backoff
	overall backoff

	// The warnings of refused logins: at most one every warnEvery, with
	// the count of those since the last.
	warned             time.Time
	refused, throttled int
}

// backoff is the failed logins of a client, or of all.
type backoff struct {
	failures int
	last     time.Time // of the last failure
	until    time.Time // no login before
}

// policy is how a backoff grows: free failures, then a wait of base that
// doubles with each further failure, up to most.
type policy struct {
	free       int
	base, most time.Duration
}

var (
	perClient = policy{free: 5, base: time.Second, most: 5 * time.Minute}
	overall   = policy{free: 50, base: time.Second, most: maxOverall}
)

const (
	maxOverall = time.Minute
	// forgetAfter is the quiet time after which failures are forgotten.
	forgetAfter = 15 * time.Minute
	// maxClients bounds the clients remembered; past it, new clients are
	// slowed by the overall backoff alone.
	maxClients = 10000
	warnEvery  = 10 * time.Second
)

func newThrottle(now func() time.Time) *throttle {
	return &throttle{now: now, clients: map[string]*backoff{}}
}

// attempt counts a login of client as a failure until it succeeds, and
// returns 0, or how long the client must wait before it may log in, and
// then the login is not counted.
func (t *throttle) attempt(client string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	b := t.clients[client]
	if b == nil {
		if len(t.clients) >= maxClients {
			t.forget(now)
		}
		b = &backoff{}
		if len(t.clients) < maxClients {
			t.clients[client] = b
		}
	}
	b.quiet(now)
	t.overall.quiet(now)
	if wait := max(b.until.Sub(now), t.overall.until.Sub(now)); wait > 0 {
		return wait
	}
	b.fail(now, perClient)
	t.overall.fail(now, overall)
	return 0
}

// succeeded takes back the failure that client's login was counted as.
func (t *throttle) succeeded(client string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.clients, client)
	t.overall.failures = max(0, t.overall.failures-1)
}

// forget drops the clients whose failures are forgotten.
func (t *throttle) forget(now time.Time) {
	for c, b := range t.clients {
		if now.Sub(b.last) >= forgetAfter {
			delete(t.clients, c)
		}
	}
}

// warn counts a refused login and reports whether to log a warning now,
// with the refusals since the last one.
func (t *throttle) warn(throttled bool) (refused, slowed int, now bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if throttled {
		t.throttled++
	} else {
		t.refused++
	}
	at := t.now()
	if at.Sub(t.warned) < warnEvery {
		return 0, 0, false
	}
	refused, slowed = t.refused, t.throttled
	t.warned, t.refused, t.throttled = at, 0, 0
	return refused, slowed, true
}

func (b *backoff) quiet(now time.Time) {
	if b.failures > 0 && now.Sub(b.last) >= forgetAfter {
		*b = backoff{}
	}
}

func (b *backoff) fail(now time.Time, p policy) {
	b.failures++
	b.last = now
	if n := b.failures - p.free; n > 0 {
		wait := p.most
		if n <= 30 {
			wait = min(p.base<<(n-1), p.most)
		}
		b.until = now.Add(wait)
	}
}

// clientOf is who sent r, as the throttle counts them: its address, or
// the /64 of an IPv6 address (one host may have all of it).
func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return host
	case ip.To4() != nil:
		return ip.String()
	default:
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
}

// refused logs a refused login, at most one warning every warnEvery.
func (in *Inbox) refused(r *http.Request, throttled bool) {
	refused, slowed, now := in.throttle.warn(throttled)
	if !now {
		return
	}
	in.log.Warn("approvals inbox: logins were refused since the last such warning (one at most every "+warnEvery.String()+
		"): unknown tokens, and logins throttled after too many", "remote", r.RemoteAddr, "unknown_tokens", refused, "throttled", slowed)
}
