package inbox

import (
	"crypto/rand"
	"crypto/subtle"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// cookieName is the session cookie: HttpOnly, SameSite=Strict, Secure on
// TLS.
const cookieName = "toolq_inbox"

// csrfHeader carries the session's CSRF token on every POST but the login.
const csrfHeader = "X-Toolq-Csrf"

// maxSessions bounds the sessions kept; past it the oldest is dropped.
const maxSessions = 1000

// session is one logged-in browser.
type session struct {
	id       string
	csrf     string
	approver *Approver
	expires  time.Time
}

// sessions are the inbox's logged-in browsers, in memory: a restart logs
// everyone out.
type sessions struct {
	mu  sync.Mutex
	ttl time.Duration
	m   map[string]*session
}

func (s *sessions) create(a *Approver) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for id, x := range s.m {
		if now.After(x.expires) {
			delete(s.m, id)
		}
	}
	for len(s.m) >= maxSessions {
		var oldest *session
		for _, x := range s.m {
			if oldest == nil || x.expires.Before(oldest.expires) {
				oldest = x
			}
		}
		delete(s.m, oldest.id)
	}
	x := &session{id: rand.Text() + rand.Text(), csrf: rand.Text() + rand.Text(), approver: a, expires: now.Add(s.ttl)}
	s.m[x.id] = x
	return x
}

// of returns the live session of r's cookie, or nil.
func (s *sessions) of(r *http.Request) *session {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	x := s.m[c.Value]
	if x == nil || time.Now().After(x.expires) {
		delete(s.m, c.Value)
		return nil
	}
	return x
}

// live reports whether x has been neither ended nor expired.
func (s *sessions) live(x *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[x.id] == x && time.Now().Before(x.expires)
}

func (s *sessions) end(x *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, x.id)
}

// setCookie gives the browser x's cookie; a nil x clears it.
func setCookie(w http.ResponseWriter, r *http.Request, x *session) {
	c := &http.Cookie{Name: cookieName, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil}
	if x == nil {
		c.MaxAge = -1
	} else {
		c.Value, c.Expires = x.id, x.expires
	}
	http.SetCookie(w, c)
}

// csrfOK reports whether r carries x's CSRF token.
func csrfOK(r *http.Request, x *session) bool {
	got := r.Header.Get(csrfHeader)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(x.csrf)) == 1
}

// sameOrigin reports whether r comes from the inbox's own page: a browser
// says so in Sec-Fetch-Site, and in Origin, whose host must be the one r
// was sent to. A state-changing request (write) must carry Origin or
// Sec-Fetch-Site, which every browser sends with a POST of fetch; a read
// without them (a link followed, curl) is let through.
func sameOrigin(r *http.Request, write bool) bool {
	site := r.Header.Get("Sec-Fetch-Site")
	if site != "" && site != "same-origin" && !(site == "none" && !write) {
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return !write || site == "same-origin"
	}
	u, err := url.Parse(origin)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && strings.EqualFold(u.Host, r.Host)
}

// Loopback reports whether addr (host:port, or a host) names this machine
// alone: localhost, 127.0.0.0/8 or ::1.
func Loopback(addr string) bool {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
