package tools

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/http/httpguts"

	"github.com/toolq/toolq/internal/jcs"
	"github.com/toolq/toolq/tracing"
)

// HTTP is the executor of a tool that calls an HTTP API. Method and URL are
// fixed here: the args become the body (JSON) or, for GET and DELETE, the
// query string, and can never choose the scheme, host or path.
type HTTP struct {
	Method  string
	URL     string
	Headers map[string]string // sent on every call; values may hold secrets
	// IdempotencyHeader names the header the key is sent in for write tools
	// ("Idempotency-Key" when empty; "-" sends no key).
	IdempotencyHeader string
	// IdempotencyForm is how the key is written in its header: "structured"
	// (the default: an RFC 8941 string, quoted, as the IETF draft says) or
	// "raw" (the bare key, as Stripe-style APIs expect: they keep the
	// quotes as part of the key).
	IdempotencyForm string
	// IdempotencyBodyField, when set, sends the key in this member of the
	// JSON body (a query parameter for GET and DELETE) instead of a header,
	// as a plain string, for APIs that take it there.
	IdempotencyBodyField string
	formGiven            bool  // IdempotencyForm was set, not defaulted
	MaxResponseBytes     int64 // default 1 MiB
	// Client sends the calls (default: net/http's transport keeping
	// IdleConnsPerHost idle connections). HTTPExecutor uses a copy whose
	// transport never re-sends a call by itself and records each request as
	// an OpenTelemetry client span (otelhttp: the HTTP semantic conventions,
	// traceparent sent downstream), and whose redirects are limited by
	// followRedirect before the client's own CheckRedirect.
	Client *http.Client

	secrets secrets // the values of the registry's ${…} references (see Load)
}

// HTTPExecutor checks h and returns a copy with its defaults filled: the
// method upper-cased (empty: POST), the Idempotency-Key header, the 1 MiB
// response limit and a client that follows a redirect only within the same
// origin and only to the call itself or its answer (followRedirect). It
// fails for a method other than GET, POST, PUT, PATCH or DELETE, and for a
// URL that is not absolute http(s) or carries a query or fragment.
// The downstream name and whether the key is forwarded come from the
// executor's Downstream and ForwardsKey methods.
func HTTPExecutor(h HTTP) (*HTTP, error) {
	h.Method = strings.ToUpper(h.Method)
	switch h.Method {
	case "":
		h.Method = http.MethodPost
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return nil, fmt.Errorf("method %q: want GET, POST, PUT, PATCH or DELETE", h.Method)
	}
	u, err := url.Parse(h.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("url %q: want an absolute http:// or https:// URL", h.secrets.redact(h.URL))
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("url %q: no query or fragment: the args make the query", h.secrets.redact(h.URL))
	}
	h.formGiven = h.IdempotencyForm != ""
	switch h.IdempotencyForm {
	case "":
		h.IdempotencyForm = KeyStructured
	case KeyStructured, KeyRaw:
	default:
		return nil, fmt.Errorf("idempotency_form %q: want structured (an RFC 8941 string) or raw (the bare key)", h.IdempotencyForm)
	}
	formSet := h.IdempotencyForm != KeyStructured || h.formGiven
	switch {
	case h.IdempotencyBodyField != "" && h.IdempotencyHeader != "" && h.IdempotencyHeader != "-":
		return nil, fmt.Errorf("idempotency_body_field %q and idempotency_header %q: the key goes in one place", h.IdempotencyBodyField, h.IdempotencyHeader)
	case h.IdempotencyBodyField != "":
		if formSet {
			return nil, fmt.Errorf("idempotency_form %q: the form is of a header; a body field carries the key as a plain string", h.IdempotencyForm)
		}
		h.IdempotencyHeader = "-"
	case h.IdempotencyHeader == "-" && formSet:
		return nil, fmt.Errorf("idempotency_form %q with idempotency_header \"-\": no key is sent", h.IdempotencyForm)
	case h.IdempotencyHeader == "":
		h.IdempotencyHeader = "Idempotency-Key"
	case h.IdempotencyHeader != "-" && !httpguts.ValidHeaderFieldName(h.IdempotencyHeader):
		return nil, fmt.Errorf("idempotency_header %q: not a valid header name", h.IdempotencyHeader)
	case h.IdempotencyHeader != "-" && reservedHeader[http.CanonicalHeaderKey(h.IdempotencyHeader)]:
		return nil, fmt.Errorf("idempotency_header %q: HTTP itself writes that header (net/http would drop the key): name another", h.IdempotencyHeader)
	}
	if h.MaxResponseBytes <= 0 {
		h.MaxResponseBytes = DefaultMaxResponse
	}
	client := h.Client
	if client == nil {
		client = &http.Client{Transport: keepAliveTransport()}
	}
	next := client.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	c := *client
	c.Transport = tracedTransport(noReplay{next: next}, h.secrets)
	c.CheckRedirect = followRedirect(client.CheckRedirect)
	h.Client = &c
	return &h, nil
}

// IdleConnsPerHost is how many idle connections an HTTP executor keeps to
// its downstream: enough for a tool's concurrency, so that calls reuse
// connections (and TLS sessions) instead of opening one each. net/http's
// default keeps two, which under load leaves a socket in TIME_WAIT for
// almost every call.
const IdleConnsPerHost = 256

// keepAliveTransport is net/http's default transport (proxy from the
// environment, HTTP/2 where the downstream offers it, its timeouts) keeping
// IdleConnsPerHost idle connections per host.
func keepAliveTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 4 * IdleConnsPerHost
	t.MaxIdleConnsPerHost = IdleConnsPerHost
	return t
}

// tracedTransport records each request as an otelhttp client span, with the
// call's key and tool on it, around inner. otelhttp wraps the request body
// it is given and keeps its GetBody, so it sits outside noReplay: what
// reaches net/http is always noReplay's, whatever otelhttp does with the
// request. Its spans use the parent span's provider, its metrics the global
// meter provider; their url.full has the secrets redacted.
func tracedTransport(inner noReplay, secrets secrets) http.RoundTripper {
	return closeIdle{
		RoundTripper: otelhttp.NewTransport(annotate{next: inner, secrets: secrets}),
		inner:        inner,
	}
}

// annotate puts the call's key and tool, from the request's context, on the
// otelhttp span the context carries, and writes its url.full (otelhttp's
// drops the userinfo, not a secret in the path) again with the secrets
// redacted.
type annotate struct {
	next    http.RoundTripper
	secrets secrets
}

func (a annotate) RoundTrip(req *http.Request) (*http.Response, error) {
	span := trace.SpanFromContext(req.Context())
	if c, ok := req.Context().Value(callKey{}).(Request); ok {
		span.SetAttributes(tracing.KeyKey.String(c.Key), tracing.KeyTool.String(c.Tool))
	}
	if len(a.secrets) > 0 {
		u := *req.URL
		u.User = nil
		span.SetAttributes(attribute.String("url.full", a.secrets.redact(u.String())))
	}
	resp, err := a.next.RoundTrip(req)
	return resp, a.secrets.redactError(err)
}

// callKey is the context key of the Request an HTTP call is made for.
type callKey struct{}

// closeIdle passes http.Client.CloseIdleConnections through otelhttp's
// transport, which does not.
type closeIdle struct {
	http.RoundTripper
	inner noReplay
}

func (c closeIdle) CloseIdleConnections() { c.inner.CloseIdleConnections() }

// noReplay is the round tripper of every executor: it hands the transport
// each request in a form the transport will not re-send by itself.
//
// net/http's Transport retries a request on a new connection when a reused
// one breaks after the request was written, if the request is replayable
// (Request.isReplayable): it has no body, or one it can rewind (GetBody),
// and it is a GET, HEAD, OPTIONS or TRACE or carries Idempotency-Key or
// X-Idempotency-Key. A write tool may well be a GET or a DELETE, and its
// key is in that header: the retry would be a second effect on a downstream
// that does not dedupe, and a retry toolq did not decide. Only toolq decides
// retries, after classifying the outcome, so every call is given a body
// that cannot be rewound: an empty one when it has none, which net/http
// sends as no body at all (it probes an unknown-length body of a GET or
// DELETE and finds it empty). Redirects are unaffected: http.Client follows
// them above the round tripper, from the request Execute built. Reads lose
// the transport's own retry too; they come back as NotSent or Ambiguous and
// are retried as any read is.
//
// It also hands the transport a body of known length up to maxInMemoryBody
// (a call's args up to that size) as bytes in memory. net/http writes the
// headers of a request whose body it does not know to be in memory on
// their own, before the body (otelhttp's wrapper of the body is such a
// body): two writes, two packets, and a downstream woken twice, on every
// call.
type noReplay struct{ next http.RoundTripper }

// maxInMemoryBody is the largest request body noReplay reads into memory.
const maxInMemoryBody = 1 << 20

func (n noReplay) RoundTrip(req *http.Request) (*http.Response, error) {
	hasBody := req.Body != nil && req.Body != http.NoBody
	inMemory := hasBody && 0 < req.ContentLength && req.ContentLength <= maxInMemoryBody
	if req.GetBody == nil && hasBody && !inMemory {
		return n.next.RoundTrip(req) // a body that cannot be rewound already
	}
	r := *req // a RoundTripper must not modify the request it is given
	r.GetBody = nil
	switch {
	case !hasBody:
		r.Body, r.ContentLength = emptyBody{}, 0
	case inMemory:
		body, err := readBody(r.Body, r.ContentLength)
		if err != nil {
			return nil, err // nothing was sent
		}
		// No GetBody: bytes the transport cannot rewind by itself.
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	return n.next.RoundTrip(&r)
}

// readBody reads and closes a request body of length n, as net/http would
// send it: a body shorter or longer than its ContentLength is an error.
func readBody(rc io.ReadCloser, n int64) ([]byte, error) {
	defer rc.Close()
	body := make([]byte, n)
	if got, err := io.ReadFull(rc, body); err != nil {
		return nil, fmt.Errorf("http: ContentLength=%d with Body length %d: %w", n, got, err)
	}
	var extra [1]byte
	if got, _ := io.ReadFull(rc, extra[:]); got > 0 {
		return nil, fmt.Errorf("http: ContentLength=%d with a longer Body", n)
	}
	return body, nil
}

// CloseIdleConnections closes the transport's idle connections, for
// http.Client.CloseIdleConnections.
func (n noReplay) CloseIdleConnections() {
	if c, ok := n.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// emptyBody is a body with nothing in it that net/http does not recognise
// as empty (http.NoBody is), and so cannot replay.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }

// Downstream is the origin the executor calls, the unit of circuit breaking.
func (h *HTTP) Downstream() string {
	u, _ := url.Parse(h.URL)
	return u.Scheme + "://" + u.Host
}

// ForwardsKey reports whether the key is sent downstream.
func (h *HTTP) ForwardsKey() bool { return h.IdempotencyHeader != "-" || h.IdempotencyBodyField != "" }

// reservedHeader are the headers net/http writes itself or drops, which
// cannot carry the key.
var reservedHeader = map[string]bool{"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Content-Type": true, "Keep-Alive": true, "Proxy-Connection": true}

// The forms of the key in its header (HTTP.IdempotencyForm).
const (
	KeyStructured = "structured" // an RFC 8941 string: "<key>"
	KeyRaw        = "raw"        // the bare key
)

// maxRedirects is how many redirects one call follows.
const maxRedirects = 3

// followRedirect is the redirect policy of every HTTP executor, applied
// before the client's own (next, nil for none). A redirect is followed only
// within the downstream's origin, so that neither the key nor the headers'
// credentials go elsewhere, and only to a request that is the call itself
// (a 307 or 308 keeps the method and body; the downstream did not act on
// the first; for a DELETE, whose args are its query, with the same query)
// or its answer (the GET after a 303: the call was processed).
// net/http would turn a write answered 301 or 302 into a GET: the call
// would never be made and the GET's answer would read as its result, so
// that redirect is not followed. Nor is one past maxRedirects, or one next
// refuses. A redirect not followed is the response Execute classifies; a
// 303 followed is marked on the call's progress.
func followRedirect(next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		first, prev := via[0].URL, via[len(via)-1]
		seeOther := req.Response.StatusCode == http.StatusSeeOther
		switch {
		case len(via) > maxRedirects:
		case req.URL.Scheme != first.Scheme || req.URL.Host != first.Host:
		case req.Method != prev.Method && !seeOther:
		case !seeOther && req.Method == http.MethodDelete && req.URL.RawQuery != first.RawQuery:
			// a DELETE's args (and a key sent in the query) are its query:
			// another query is another call
		case next != nil && next(req, via) != nil:
		default:
			if p, ok := req.Context().Value(progressKey{}).(*progress); ok && seeOther {
				p.processed.Store(true)
			}
			return nil
		}
		return http.ErrUseLastResponse
	}
}

// progress is how far one call got, which decides what a failure means.
type progress struct {
	// mayHaveSent: the request had a connection, so it may have reached
	// the downstream. net/http reports it written only after its last
	// bytes went out, and over HTTP/2 RoundTrip returns on a timeout
	// without waiting for that report: a call the downstream acted on
	// must not read as not sent.
	mayHaveSent atomic.Bool
	// processed: the downstream answered 303 See Other, and the client
	// followed it. The call was processed; what comes after only says how.
	processed atomic.Bool
}

// progressKey is the context key of a call's *progress.
type progressKey struct{}

// Execute sends one request and classifies what happened:
//
//	connection refused, DNS or TLS failure, no connection            → NotSent
//	429; 503 with Retry-After                                        → NotSent, retry after that
//	a 307 or 308 not followed (see followRedirect)                   → NotSent: the downstream did not act
//	another 3xx not followed to a write (a 301 or 302 to a POST)     → Ambiguous: it may have acted (Post/Redirect/Get)
//	409 when the key was sent (same key in flight downstream)        → Ambiguous, retry later
//	other 4xx                                                        → Definite
//	a 303 not followed; after a 303 followed, anything but a 2xx     → Ambiguous: the call was processed
//	timeout or reset once the request had a connection; other 5xx    → Ambiguous
//	2xx                                                              → Success
func (h *HTTP) Execute(ctx context.Context, req Request) (json.RawMessage, error) {
	out, err := h.execute(ctx, req)
	return h.secrets.redactJSON(out), h.secrets.redactError(err)
}

// execute is Execute, its errors not yet redacted.
func (h *HTTP) execute(ctx context.Context, req Request) (json.RawMessage, error) {
	target := h.URL
	var body io.Reader
	keySent := req.Key != "" && h.ForwardsKey()
	args := req.Args
	if keySent && h.IdempotencyBodyField != "" {
		var err error
		if args, err = withMember(args, h.IdempotencyBodyField, req.Key); err != nil {
			return nil, DefiniteError("invalid_args", err.Error())
		}
	}
	if h.Method == http.MethodGet || h.Method == http.MethodDelete {
		q, err := queryFromArgs(args)
		if err != nil {
			return nil, DefiniteError("invalid_args", err.Error())
		}
		if q != "" {
			target += "?" + q
		}
	} else {
		if len(args) > maxInMemoryBody {
			// noReplay hands the transport a copy of a body up to that size
			// only; a larger one the transport may still read after Execute
			// returned (an early answer, a timeout), so it reads its own.
			args = bytes.Clone(args)
		}
		body = bytes.NewReader(args)
	}
	// What reaches the transport: the call (for its span), and whether the
	// request may have gone out (for an error's outcome).
	p := new(progress)
	ctx = context.WithValue(ctx, callKey{}, Request{Tool: req.Tool, Key: req.Key})
	ctx = context.WithValue(ctx, progressKey{}, p)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:      func(httptrace.GotConnInfo) { p.mayHaveSent.Store(true) },
		WroteHeaders: func() { p.mayHaveSent.Store(true) },
		WroteRequest: func(httptrace.WroteRequestInfo) { p.mayHaveSent.Store(true) },
	})
	hreq, err := http.NewRequestWithContext(ctx, h.Method, target, body)
	if err != nil {
		return nil, NotSentError("bad_request", err.Error(), 0, err)
	}
	if body != nil {
		// The body's GetBody (set by NewRequest) lets http.Client send the
		// call on after a 307 or 308 (see followRedirect); the transport
		// never sees it (see noReplay).
		hreq.Header.Set("Content-Type", "application/json")
	}
	hreq.Header.Set("Accept", "application/json")
	hreq.Header.Set("User-Agent", "toolq")
	for k, v := range h.Headers {
		hreq.Header.Set(k, v)
	}
	// The trace continues downstream: otelhttp sends W3C traceparent.
	if keySent && h.IdempotencyBodyField == "" {
		v := req.Key
		if h.IdempotencyForm == KeyStructured {
			v = strconv.Quote(v) // draft-ietf-httpapi-idempotency-key-header: an sf-string
		}
		hreq.Header.Set(h.IdempotencyHeader, v)
	}
	resp, err := h.Client.Do(hreq)
	if err != nil && p.processed.Load() {
		return nil, AmbiguousError("see_other_unread", "after 303 See Other (the call was processed): "+oneLine(err.Error()), 0, err)
	}
	if err != nil {
		return nil, classifyTransportError(err, p.mayHaveSent.Load())
	}
	defer resp.Body.Close()
	data, readErr := io.ReadAll(io.LimitReader(resp.Body, h.MaxResponseBytes+1))
	tooLarge := int64(len(data)) > h.MaxResponseBytes
	if readErr != nil && !tooLarge {
		// The downstream answered, then the connection broke mid-response.
		return nil, AmbiguousError("reset_mid_response", fmt.Sprintf("HTTP %d, then: %v", resp.StatusCode, readErr), 0, readErr)
	}
	status := resp.StatusCode
	success := status >= 200 && status < 300
	if !success && (status == http.StatusSeeOther || p.processed.Load()) {
		return nil, AmbiguousError("http_"+strconv.Itoa(status), "after 303 See Other (the call was processed): "+h.redirectNote(resp, data), retryAfter(resp, 0), nil)
	}
	switch {
	case success:
		if tooLarge {
			// The effect happened; only its description is too large to carry.
			return json.RawMessage(fmt.Sprintf(`{"status":%d,"response_too_large":true,"limit_bytes":%d}`, status, h.MaxResponseBytes)), nil
		}
		return outputOf(status, data), nil
	case status == http.StatusTooManyRequests:
		return nil, NotSentError("http_429", h.secrets.snippet(data), retryAfter(resp, DefaultNotSentDelay), nil)
	case status == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
		return nil, NotSentError("http_503", h.secrets.snippet(data), retryAfter(resp, DefaultNotSentDelay), nil)
	case status == http.StatusConflict && keySent:
		return nil, AmbiguousError("http_409", "the same key is still being processed downstream: "+h.secrets.snippet(data), retryAfter(resp, DefaultNotSentDelay), nil)
	case status == http.StatusTemporaryRedirect || status == http.StatusPermanentRedirect || (status >= 300 && status < 400 && h.Method == http.MethodGet):
		// 307 and 308 mean that the request was not processed here; a GET
		// changes nothing wherever it was answered.
		return nil, NotSentError("http_"+strconv.Itoa(status), "redirect not followed, the downstream did not act: "+h.redirectNote(resp, data), retryAfter(resp, 0), nil)
	case status >= 300 && status < 400:
		// A 301 or 302 to a write is often the answer of a write that was
		// made (Post/Redirect/Get); nothing says it was not.
		return nil, AmbiguousError("http_"+strconv.Itoa(status), "redirect not followed, the downstream may have acted: "+h.redirectNote(resp, data), retryAfter(resp, 0), nil)
	case status >= 400 && status < 500:
		return nil, DefiniteError("http_"+strconv.Itoa(status), h.secrets.snippet(data))
	default:
		return nil, AmbiguousError("http_"+strconv.Itoa(status), h.secrets.snippet(data), retryAfter(resp, 0), nil)
	}
}

// redirectNote says where a 3xx pointed, and what it said.
func (h *HTTP) redirectNote(resp *http.Response, body []byte) string {
	note := "Location " + strconv.Quote(resp.Header.Get("Location"))
	if s := h.secrets.snippet(body); s != "" {
		note += ": " + s
	}
	return note
}

// classifyTransportError maps an error of http.Client.Do. Before the request
// had a connection nothing can have happened; after it, anything may have.
func classifyTransportError(err error, mayHaveSent bool) error {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	var tlsErr *tls.CertificateVerificationError
	switch {
	case errors.As(err, &dnsErr):
		return NotSentError("dns_failure", oneLine(err.Error()), 0, err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return NotSentError("connection_refused", oneLine(err.Error()), 0, err)
	case errors.As(err, &tlsErr):
		return NotSentError("tls_failure", oneLine(err.Error()), 0, err)
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return NotSentError("dial_failure", oneLine(err.Error()), 0, err)
	case !mayHaveSent:
		return NotSentError("not_sent", oneLine(err.Error()), 0, err)
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return AmbiguousError("timeout", "no answer after the request was sent: "+oneLine(err.Error()), 0, err)
	default:
		return AmbiguousError("connection_lost", "connection broke after the request was sent: "+oneLine(err.Error()), 0, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func retryAfter(resp *http.Response, def time.Duration) time.Duration {
	v := resp.Header.Get("Retry-After")
	if v == "" {
		return def
	}
	if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return def
}

// outputOf is the result output of a 2xx answer: the body when it is JSON,
// else the status and the body as a string. Either way it is valid UTF-8, as
// the ledger requires: json.Valid accepts invalid bytes inside strings, so
// those are replaced by U+FFFD one by one, as json.Marshal replaces them in
// the body of a non-JSON answer. The replacement keeps the JSON valid, since
// outside strings JSON allows only ASCII.
func outputOf(status int, body []byte) json.RawMessage {
	if len(body) > 0 && json.Valid(body) {
		return json.RawMessage(validUTF8(body))
	}
	out, _ := json.Marshal(struct {
		Status int    `json:"status"`
		Body   string `json:"body"`
	}{status, string(body)})
	return out
}

// validUTF8 returns b with each byte that is not part of a valid UTF-8
// sequence replaced by U+FFFD.
func validUTF8(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}

// queryFromArgs turns the args object into a query string, members in
// sorted order: strings as they are, other values as canonical JSON.
// withMember is the args object with the member name set to the string
// value, last (so that a parser that takes the last of two look-alike names
// takes it); args with a member the downstream could take for it are
// refused (see CheckArgs).
func withMember(args json.RawMessage, name, value string) (json.RawMessage, error) {
	members, err := lookAlike(args, name)
	if err != nil {
		return nil, err
	}
	n, _ := json.Marshal(name)
	v, _ := json.Marshal(value)
	body := bytes.TrimSpace(args)
	out := append([]byte(nil), body[:len(body)-1]...) // without its closing brace
	if members > 0 {
		out = append(out, ',')
	}
	out = append(append(append(append(out, n...), ':'), v...), '}')
	return out, nil
}

// CheckArgs refuses args with a member that the downstream could take for
// the one that carries the key (IdempotencyBodyField): many servers match
// member and parameter names ignoring case (Go's encoding/json, ASP.NET,
// Jackson configured so), some ignore separators or a trailing [] (PHP).
// Such args would replace the key the downstream collapses calls by. Run
// before the call is claimed (Tool.Validate), and again before it is sent.
func (h *HTTP) CheckArgs(args json.RawMessage) error {
	if h.IdempotencyBodyField == "" {
		return nil
	}
	_, err := lookAlike(args, h.IdempotencyBodyField)
	return err
}

// lookAlike counts the members of the args object, refusing one whose name
// is name's in the eyes of a lenient parser (looseName).
func lookAlike(args json.RawMessage, name string) (int, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(args, &members); err != nil || members == nil {
		return 0, errors.New("args must be an object")
	}
	want := looseName(name)
	for m := range members {
		if looseName(m) == want {
			return 0, fmt.Errorf("the args have a member %q, which the downstream could take for %q, where the tool sends its idempotency key (idempotency_body_field)", m, name)
		}
	}
	return len(members), nil
}

// looseName is a member name as a lenient parser may read it: without a
// trailing "[]" or the separators _ - . and space, each character replaced
// by the least of its case-folding orbit (K, k and the Kelvin sign are one).
func looseName(s string) string {
	s = strings.TrimSuffix(s, "[]")
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '_', '-', '.', ' ':
			continue
		}
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

func queryFromArgs(args json.RawMessage) (string, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(args, &members); err != nil {
		return "", errors.New("args must be an object")
	}
	names := make([]string, 0, len(members))
	for name := range members {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, name := range names {
		raw := members[name]
		var value string
		if len(raw) > 0 && raw[0] == '"' {
			if err := json.Unmarshal(raw, &value); err != nil {
				return "", err
			}
		} else {
			canon, err := jcs.Canonicalize(raw)
			if err != nil {
				return "", err
			}
			value = string(canon)
		}
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(url.QueryEscape(name) + "=" + url.QueryEscape(value))
	}
	return b.String(), nil
}
