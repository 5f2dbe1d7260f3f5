package tools_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/tracing"
)

const anySchema = `{"type":"object"}`

// httpTool registers one HTTP tool of the given class against url.
func httpTool(t *testing.T, class tools.Class, method, url string, timeout time.Duration) *tools.Tool {
	t.Helper()
	exec, err := tools.HTTPExecutor(tools.HTTP{Method: method, URL: url})
	if err != nil {
		t.Fatal(err)
	}
	fwd := exec.ForwardsKey()
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "t", Class: class, Schema: json.RawMessage(anySchema),
		Executor: exec, Downstream: exec.Downstream(), ForwardsKey: &fwd, Timeout: timeout,
		Breaker: tools.Breaker{Failures: 1000}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("t")
	return tool
}

func call(t *testing.T, tool *tools.Tool, args string) (json.RawMessage, tools.Outcome, *tools.Error) {
	t.Helper()
	out, err := tool.Run(context.Background(), tools.Request{Tool: tool.Name, Key: "k123", Args: json.RawMessage(args), ToolUseID: "toolu_1"})
	outcome, te := tools.Classify(err)
	return out, outcome, te
}

// rawListener accepts TCP connections and hands each to handle.
func rawListener(t *testing.T, handle func(net.Conn)) string {
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
			go handle(c)
		}
	}()
	return "http://" + l.Addr().String()
}

// readRequest consumes one HTTP request from c.
func readRequest(c net.Conn) {
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err == nil {
		req.Body.Close()
	}
}

func reset(c net.Conn) {
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
}

func TestHTTPClassification(t *testing.T) {
	t.Parallel()
	refused := func() string { // a port nobody listens on
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := l.Addr().String()
		l.Close()
		return "http://" + addr
	}()
	acceptThenReset := rawListener(t, func(c net.Conn) { readRequest(c); reset(c) })
	neverAnswers := rawListener(t, func(c net.Conn) { readRequest(c); time.Sleep(5 * time.Second); c.Close() })
	resetMidResponse := rawListener(t, func(c net.Conn) {
		readRequest(c)
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
		time.Sleep(50 * time.Millisecond)
		reset(c)
	})
	status := func(code int, header map[string]string, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for k, v := range header {
				w.Header().Set(k, v)
			}
			w.WriteHeader(code)
			fmt.Fprint(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	for _, tc := range []struct {
		name       string
		class      tools.Class
		url        string
		want       tools.Outcome
		code       string
		retryAfter time.Duration
	}{
		{"connection refused", tools.KeyedWrite, refused, tools.NotSent, "connection_refused", 0},
		{"DNS failure", tools.KeyedWrite, "http://toolq-no-such-host.invalid", tools.NotSent, "dns_failure", 0},
		{"accepted then reset", tools.KeyedWrite, acceptThenReset, tools.Ambiguous, "connection_lost", 0},
		{"never answers", tools.KeyedWrite, neverAnswers, tools.Ambiguous, "timeout", 0},
		{"reset mid-response", tools.KeyedWrite, resetMidResponse, tools.Ambiguous, "reset_mid_response", 0},
		{"429 with Retry-After", tools.KeyedWrite, status(429, map[string]string{"Retry-After": "7"}, `{}`), tools.NotSent, "http_429", 7 * time.Second},
		{"503 with Retry-After", tools.UnkeyedWrite, status(503, map[string]string{"Retry-After": "3"}, ``), tools.NotSent, "http_503", 3 * time.Second},
		{"503 without Retry-After", tools.UnkeyedWrite, status(503, nil, ``), tools.Ambiguous, "http_503", 0},
		{"409 from a keyed downstream", tools.KeyedWrite, status(409, map[string]string{"Retry-After": "2"}, `{}`), tools.Ambiguous, "http_409", 2 * time.Second},
		{"409 to a read", tools.Read, status(409, nil, `{}`), tools.Definite, "http_409", 0},
		{"422", tools.KeyedWrite, status(422, nil, `{"error":"bad"}`), tools.Definite, "http_422", 0},
		{"404", tools.UnkeyedWrite, status(404, nil, `nope`), tools.Definite, "http_404", 0},
		{"500", tools.KeyedWrite, status(500, nil, `oops`), tools.Ambiguous, "http_500", 0},
		{"502", tools.UnkeyedWrite, status(502, nil, ``), tools.Ambiguous, "http_502", 0},
		{"200", tools.KeyedWrite, status(200, nil, `{"id":"pay_1"}`), tools.Success, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tool := httpTool(t, tc.class, "POST", tc.url, 300*time.Millisecond)
			_, got, te := call(t, tool, `{"a":1}`)
			if got != tc.want {
				t.Fatalf("outcome %s (%v), want %s", got, te, tc.want)
			}
			if te != nil && (te.Code != tc.code || te.RetryAfter != tc.retryAfter) {
				t.Fatalf("error %+v, want code %s retry after %s", te, tc.code, tc.retryAfter)
			}
			if te != nil && strings.Contains(te.Error(), "\n") {
				t.Fatalf("error is not one line: %q", te.Error())
			}
		})
	}
}

func TestHTTPOutputAndHeaders(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Clone(context.Background()))
		switch r.URL.Path {
		case "/text":
			fmt.Fprint(w, "plain words")
		case "/big":
			fmt.Fprint(w, `{"x":"`+strings.Repeat("a", 2<<20)+`"}`)
		default:
			fmt.Fprint(w, `{"ok":true}`)
		}
	}))
	defer srv.Close()
	out, outcome, _ := call(t, httpTool(t, tools.KeyedWrite, "POST", srv.URL+"/json", time.Second), `{"b":2,"a":1}`)
	if outcome != tools.Success || string(out) != `{"ok":true}` {
		t.Fatalf("json: %s %s", outcome, out)
	}
	r := got.Load().(*http.Request)
	if r.Header.Get("Idempotency-Key") != `"k123"` || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("write headers: %v", r.Header)
	}
	out, _, _ = call(t, httpTool(t, tools.Read, "POST", srv.URL+"/text", time.Second), `{}`)
	if string(out) != `{"status":200,"body":"plain words"}` {
		t.Fatalf("text: %s", out)
	}
	if r := got.Load().(*http.Request); r.Header.Get("Idempotency-Key") != "" {
		t.Fatalf("a read tool sent the key: %v", r.Header)
	}
	out, outcome, _ = call(t, httpTool(t, tools.KeyedWrite, "POST", srv.URL+"/big", 5*time.Second), `{}`)
	if outcome != tools.Success || !strings.Contains(string(out), `"response_too_large":true`) {
		t.Fatalf("oversized answer: %s %s", outcome, out)
	}
}

// TestHTTPOutputIsValidUTF8JSON: whatever bytes a downstream answers with,
// the output is JSON in valid UTF-8 that says what the answer said, invalid
// bytes replaced by U+FFFD as encoding/json replaces them; a database that
// stores it as text (Postgres) would refuse anything else.
func TestHTTPOutputIsValidUTF8JSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body, want string
	}{
		{"valid JSON", `{"name":"café"}`, `{"name":"café"}`},
		{"JSON with an invalid byte", "{\"name\":\"caf\xe9\", \"n\": 1}", "{\"name\":\"caf\uFFFD\", \"n\": 1}"},
		{"JSON with a truncated rune", "[\"\xe2\x82\", \"ok\"]", "[\"\uFFFD\uFFFD\", \"ok\"]"},
		{"text with an invalid byte", "caf\xe9 ok", `{"status":200,"body":"caf\ufffd ok"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, tc.body)
			}))
			defer srv.Close()
			out, outcome, te := call(t, httpTool(t, tools.KeyedWrite, "POST", srv.URL, time.Second), `{}`)
			if outcome != tools.Success {
				t.Fatalf("outcome %s %v", outcome, te)
			}
			if !utf8.Valid(out) || !json.Valid(out) {
				t.Fatalf("output %q is not valid UTF-8 JSON", out)
			}
			if string(out) != tc.want {
				t.Fatalf("output %q, want %q", out, tc.want)
			}
		})
	}
}

// TestHTTPArgsCannotSteer: whatever the args say, the request goes to the
// registry's scheme, host and path.
func TestHTTPArgsCannotSteer(t *testing.T) {
	t.Parallel()
	var paths []string
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path)
		queries = append(queries, r.URL.RawQuery)
		fmt.Fprint(w, `{}`)
	}))
	defer srv.Close()
	evil := `{"url":"http://evil.example/","path":"/../admin","host":"evil.example","query":"x&admin=1#frag","../..":"?a=b"}`
	get := httpTool(t, tools.Read, "GET", srv.URL+"/v1/orders", time.Second)
	if _, outcome, te := call(t, get, evil); outcome != tools.Success {
		t.Fatalf("GET: %s %v", outcome, te)
	}
	post := httpTool(t, tools.KeyedWrite, "POST", srv.URL+"/v1/payments", time.Second)
	if _, outcome, te := call(t, post, evil); outcome != tools.Success {
		t.Fatalf("POST: %s %v", outcome, te)
	}
	if paths[0] != "/v1/orders" || paths[1] != "/v1/payments" {
		t.Fatalf("paths %q", paths)
	}
	if queries[0] != "..%2F..=%3Fa%3Db&host=evil.example&path=%2F..%2Fadmin&query=x%26admin%3D1%23frag&url=http%3A%2F%2Fevil.example%2F" || queries[1] != "" {
		t.Fatalf("queries %q", queries)
	}
	// A redirect to another origin is not followed (nothing was done: not
	// sent); a 303 to the same origin (the write was done, here is its
	// result) is followed. TestHTTPRedirectIsFollowedOnlyWhereItSendsTheSameCall
	// has every case.
	var stolen atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { stolen.Add(1); fmt.Fprint(w, `{"stolen":true}`) }))
	defer other.Close()
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/here" {
			fmt.Fprint(w, `{"here":true}`)
			return
		}
		if r.URL.Path == "/same" {
			http.Redirect(w, r, "/here", http.StatusSeeOther)
			return
		}
		http.Redirect(w, r, other.URL+"/x", http.StatusTemporaryRedirect)
	}))
	defer redirecting.Close()
	if _, outcome, te := call(t, httpTool(t, tools.Read, "GET", redirecting.URL+"/away", time.Second), `{}`); outcome != tools.NotSent || te.Code != "http_307" {
		t.Fatalf("cross-origin redirect of a read: %s %v", outcome, te)
	}
	if _, outcome, te := call(t, httpTool(t, tools.KeyedWrite, "POST", redirecting.URL+"/away", time.Second), `{}`); outcome != tools.NotSent {
		t.Fatalf("cross-origin redirect of a write: %s %v", outcome, te)
	}
	if stolen.Load() != 0 {
		t.Fatal("a redirect took a call to another origin")
	}
	if out, outcome, _ := call(t, httpTool(t, tools.KeyedWrite, "POST", redirecting.URL+"/same", time.Second), `{}`); outcome != tools.Success || string(out) != `{"here":true}` {
		t.Fatalf("same-origin redirect: %s %s", outcome, out)
	}
	for _, bad := range []string{"ftp://x/y", "/relative", "http://h/p?q=1", "http://h/p#f"} {
		if _, err := tools.HTTPExecutor(tools.HTTP{URL: bad}); err == nil {
			t.Errorf("url %q accepted", bad)
		}
	}
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	var code atomic.Int32
	code.Store(500)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(int(code.Load()))
		fmt.Fprint(w, `{}`)
	}))
	defer srv.Close()
	exec, _ := tools.HTTPExecutor(tools.HTTP{URL: srv.URL})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(anySchema),
		Executor: exec, Downstream: exec.Downstream(), Timeout: time.Second,
		Breaker: tools.Breaker{Failures: 3, OpenFor: 300 * time.Millisecond}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	// Definite failures and cancellations do not trip it.
	code.Store(400)
	for range 5 {
		if _, o, _ := call(t, tool, `{}`); o != tools.Definite {
			t.Fatalf("outcome %s", o)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 5 {
		tool.Run(ctx, tools.Request{Args: json.RawMessage(`{}`)})
	}
	if tool.BreakerState() != "closed" {
		t.Fatalf("breaker %s after definite failures and cancellations", tool.BreakerState())
	}
	code.Store(500)
	for i := range 3 {
		if _, o, _ := call(t, tool, `{}`); o != tools.Ambiguous {
			t.Fatalf("call %d: %s", i, o)
		}
	}
	if tool.BreakerState() != "open" {
		t.Fatalf("breaker %s after 3 failures", tool.BreakerState())
	}
	before := hits.Load()
	_, o, te := call(t, tool, `{}`)
	if o != tools.NotSent || te.Code != "breaker_open" || te.RetryAfter <= 0 || te.RetryAfter > 300*time.Millisecond {
		t.Fatalf("while open: %s %+v", o, te)
	}
	if hits.Load() != before {
		t.Fatal("an open breaker let a request through")
	}
	// After the open period a trial call goes through; its success closes it.
	code.Store(200)
	testenv.Eventually(t, 5*time.Second, "the breaker to leave open", func() bool { return tool.BreakerState() != "open" })
	if _, o, te := call(t, tool, `{}`); o != tools.Success {
		t.Fatalf("trial call: %s %v", o, te)
	}
	if tool.BreakerState() != "closed" {
		t.Fatalf("breaker %s after a successful trial", tool.BreakerState())
	}
}

func TestClassifyUnknownErrorsAsAmbiguous(t *testing.T) {
	t.Parallel()
	if o, _ := tools.Classify(errors.New("something odd")); o != tools.Ambiguous {
		t.Fatalf("unknown error: %s", o)
	}
	if o, _ := tools.Classify(nil); o != tools.Success {
		t.Fatalf("nil: %s", o)
	}
	if o, te := tools.Classify(fmt.Errorf("wrapped: %w", tools.DefiniteError("no", "x"))); o != tools.Definite || te.Code != "no" {
		t.Fatalf("wrapped definite: %s", o)
	}
}

// TestUnkeyedWriteIsNeverResentByTheHTTPClient: a downstream without dedupe
// applies the effect and drops the connection. net/http re-sends a request
// on a reused connection by itself when it deems it replayable: a GET, HEAD,
// OPTIONS or TRACE without a body, or any request carrying Idempotency-Key.
// toolq's executor must not let it, whatever the method: one call, one
// effect, an ambiguous outcome.
func TestUnkeyedWriteIsNeverResentByTheHTTPClient(t *testing.T) {
	t.Parallel()
	for _, class := range []tools.Class{tools.UnkeyedWrite, tools.KeyedWrite} {
		for _, method := range []string{"POST", "GET", "DELETE"} {
			t.Run(string(class)+"/"+method, func(t *testing.T) {
				t.Parallel()
				var effects atomic.Int32
				var drop atomic.Bool
				var framing atomic.Value
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					effects.Add(1)
					if r.Method != method {
						t.Errorf("method %s, want %s", r.Method, method)
					}
					if method != "POST" && (r.ContentLength != 0 || len(r.TransferEncoding) != 0) {
						framing.Store(fmt.Sprintf("content-length %d, transfer-encoding %q", r.ContentLength, r.TransferEncoding))
					}
					if drop.Load() {
						c, _, _ := w.(http.Hijacker).Hijack()
						reset(c)
						return
					}
					fmt.Fprint(w, `{"id":"tkt"}`)
				}))
				defer srv.Close()
				tool := httpTool(t, class, method, srv.URL+"/v1/tickets", 2*time.Second)
				if _, o, _ := call(t, tool, `{"a":1}`); o != tools.Success { // leaves a kept-alive connection to reuse
					t.Fatalf("first call: %s", o)
				}
				drop.Store(true)
				if _, o, te := call(t, tool, `{"a":1}`); o != tools.Ambiguous {
					t.Fatalf("dropped call: %s %v", o, te)
				}
				if n := effects.Load(); n != 2 {
					t.Fatalf("%d effects for 2 calls: the HTTP client re-sent a %s write", n, method)
				}
				if f := framing.Load(); f != nil {
					t.Fatalf("a %s without args in its body was sent with %s", method, f)
				}
			})
		}
	}
}

// TestHTTPExecutorReusesConnections: concurrent calls to one downstream
// reuse a pool of connections instead of opening one per call.
func TestHTTPExecutorReusesConnections(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(`{"ok":true}`))
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	exec, err := tools.HTTPExecutor(tools.HTTP{Method: "POST", URL: srv.URL + "/v1/x"})
	if err != nil {
		t.Fatal(err)
	}
	const workers, calls = 16, 20
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				if _, err := exec.Execute(context.Background(), tools.Request{Tool: "t", Key: fmt.Sprintf("k%d-%d", w, i), Args: json.RawMessage(`{}`)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := conns.Load(); n > 2*workers {
		t.Fatalf("%d connections for %d calls by %d concurrent callers: connections are not kept alive", n, workers*calls, workers)
	}
}

// TestHTTPCallIsAClientSpan: each request is an otelhttp client span under
// the caller's span, with the HTTP semantic conventions and the call's key,
// and the downstream receives its traceparent.
func TestHTTPCallIsAClientSpan(t *testing.T) {
	t.Parallel()
	otel.SetTextMapPropagator(tracing.Propagator())
	var traceparent atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		traceparent.Store(r.Header.Get("traceparent"))
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer srv.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, parent := tp.Tracer("test").Start(context.Background(), "tool t")
	tool := httpTool(t, tools.KeyedWrite, "POST", srv.URL+"/v1/pay", time.Second)
	if _, err := tool.Run(ctx, tools.Request{Tool: tool.Name, Key: "k123", Args: json.RawMessage(`{}`), ToolUseID: "toolu_1"}); err != nil {
		t.Fatal(err)
	}
	parent.End()
	var client sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindClient {
			client = s
		}
	}
	if client == nil {
		t.Fatalf("no client span among %d", len(rec.Ended()))
	}
	attrs := map[attribute.Key]string{}
	for _, kv := range client.Attributes() {
		attrs[kv.Key] = kv.Value.String()
	}
	for k, want := range map[attribute.Key]string{"http.request.method": "POST", "http.response.status_code": "200", "toolq.key": "k123", "toolq.tool": "t"} {
		if attrs[k] != want {
			t.Errorf("%s = %q, want %q (all: %v)", k, attrs[k], want, attrs)
		}
	}
	if client.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("client span's parent %s, want %s", client.Parent().SpanID(), parent.SpanContext().SpanID())
	}
	if tp, _ := traceparent.Load().(string); !strings.Contains(tp, parent.SpanContext().TraceID().String()) || !strings.Contains(tp, client.SpanContext().SpanID().String()) {
		t.Errorf("traceparent %q, want trace %s and span %s", tp, parent.SpanContext().TraceID(), client.SpanContext().SpanID())
	}
}

// TestHTTPRedirectIsFollowedOnlyWhereItSendsTheSameCall: a redirect is
// followed within the downstream's origin when the request it leads to is
// the call itself (307 and 308 keep the method and body, and carry the key)
// or its answer (303). A 307 or 308 that is not followed (to another
// origin, no Location, too many hops), or any 3xx to a GET, means the
// downstream did not act: not sent, tried again. Another 3xx to a write
// (a 301 or 302 that would turn it into a GET, a 300) may follow a write
// that was made (Post/Redirect/Get): ambiguous, never sent again unkeyed.
// After a 303 the call was processed, so anything but a 2xx at its target
// is ambiguous.
func TestHTTPRedirectIsFollowedOnlyWhereItSendsTheSameCall(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		fmt.Fprint(w, `{"other":true}`)
	}))
	defer other.Close()
	type arrival struct{ method, body, key string }
	var mu sync.Mutex
	var arrived []arrival
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var code int
		switch path := r.URL.Path; {
		case path == "/target":
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			arrived = append(arrived, arrival{r.Method, string(body), r.Header.Get("Idempotency-Key")})
			mu.Unlock()
			fmt.Fprintf(w, `{"method":%q}`, r.Method)
		case path == "/missing":
			http.NotFound(w, r)
		case path == "/loop":
			http.Redirect(w, r, "/loop", http.StatusTemporaryRedirect)
		case path == "/no-location":
			w.WriteHeader(http.StatusTemporaryRedirect)
		case path == "/see-other-missing":
			http.Redirect(w, r, "/missing", http.StatusSeeOther)
		case path == "/choices":
			w.Header().Set("Location", "/target")
			w.WriteHeader(http.StatusMultipleChoices)
		case strings.HasPrefix(path, "/same/"):
			code, _ = strconv.Atoi(strings.TrimPrefix(path, "/same/"))
			http.Redirect(w, r, "/target", code)
		case strings.HasPrefix(path, "/away/"):
			code, _ = strconv.Atoi(strings.TrimPrefix(path, "/away/"))
			http.Redirect(w, r, other.URL+"/target", code)
		}
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name   string
		class  tools.Class
		method string
		path   string
		want   tools.Outcome
		code   string
		// what reached /target: "" nothing, else the method, with the body
		// and key of the call for a POST
		target string
	}{
		{"307 within the origin", tools.KeyedWrite, "POST", "/same/307", tools.Success, "", "POST"},
		{"308 within the origin", tools.KeyedWrite, "POST", "/same/308", tools.Success, "", "POST"},
		{"307 of an unkeyed write", tools.UnkeyedWrite, "POST", "/same/307", tools.Success, "", "POST"},
		{"307 to another origin", tools.KeyedWrite, "POST", "/away/307", tools.NotSent, "http_307", ""},
		{"308 to another origin", tools.UnkeyedWrite, "POST", "/away/308", tools.NotSent, "http_308", ""},
		{"301 of a POST", tools.KeyedWrite, "POST", "/same/301", tools.Ambiguous, "http_301", ""},
		{"302 of a POST (Post/Redirect/Get: the write was made)", tools.UnkeyedWrite, "POST", "/same/302", tools.Ambiguous, "http_302", ""},
		{"301 of a DELETE", tools.UnkeyedWrite, "DELETE", "/same/301", tools.Ambiguous, "http_301", ""},
		{"303 within the origin", tools.KeyedWrite, "POST", "/same/303", tools.Success, "", "GET"},
		{"303 to another origin", tools.UnkeyedWrite, "POST", "/away/303", tools.Ambiguous, "http_303", ""},
		{"303 to an answer that is not there", tools.UnkeyedWrite, "POST", "/see-other-missing", tools.Ambiguous, "http_404", ""},
		{"307 without Location", tools.KeyedWrite, "POST", "/no-location", tools.NotSent, "http_307", ""},
		{"307 for ever", tools.KeyedWrite, "POST", "/loop", tools.NotSent, "http_307", ""},
		{"300", tools.KeyedWrite, "POST", "/choices", tools.Ambiguous, "http_300", ""},
		{"301 of a read", tools.Read, "GET", "/same/301", tools.Success, "", "GET"},
		{"307 of a DELETE to another query (its args)", tools.KeyedWrite, "DELETE", "/same/307", tools.NotSent, "http_307", ""},
		{"302 of a read to another origin", tools.Read, "GET", "/away/302", tools.NotSent, "http_302", ""},
	} {
		mu.Lock()
		arrived = nil
		mu.Unlock()
		_, got, te := call(t, httpTool(t, tc.class, tc.method, srv.URL+tc.path, 2*time.Second), `{"a":1}`)
		if got != tc.want || (te != nil && te.Code != tc.code) {
			t.Errorf("%s: %s %v, want %s %s", tc.name, got, te, tc.want, tc.code)
		}
		mu.Lock()
		reached := append([]arrival(nil), arrived...)
		mu.Unlock()
		switch {
		case tc.target == "" && len(reached) > 0:
			t.Errorf("%s: the redirect was followed: %+v", tc.name, reached)
		case tc.target != "" && (len(reached) != 1 || reached[0].method != tc.target):
			t.Errorf("%s: %+v reached the target, want one %s", tc.name, reached, tc.target)
		case tc.target == "POST" && (reached[0].body != `{"a":1}` || reached[0].key != `"k123"`):
			t.Errorf("%s: the redirected call lost its body or key: %+v", tc.name, reached[0])
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("%d calls went to another origin", n)
	}
}

// TestHTTPCallThatReachedAnHTTP2DownstreamIsNeverNotSent: over HTTP/2 a
// timeout can end the round trip after the request's last frame went out
// but before net/http reports it written (httptrace's WroteRequest and
// WroteHeaders run on the stream's writer goroutine, which RoundTrip does
// not wait for). The downstream acted: the outcome must be ambiguous, never
// not sent (which would release the claim and send an unkeyed write again).
// The test holds the writer right after the request's headers went out
// (for a DELETE, the whole call) and ends the call's context then.
func TestHTTPCallThatReachedAnHTTP2DownstreamIsNeverNotSent(t *testing.T) {
	t.Parallel()
	acted := make(chan struct{})
	var once sync.Once
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			t.Errorf("the call came over %s", r.Proto)
		}
		once.Do(func() { close(acted) }) // the comment is deleted
		<-r.Context().Done()
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	exec, err := tools.HTTPExecutor(tools.HTTP{Method: "DELETE", URL: srv.URL + "/v1/comments/7", Client: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	returned := make(chan struct{})
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() {
		select {
		case <-acted:
		case <-time.After(10 * time.Second):
			t.Error("the downstream never saw the call")
		}
		cancel() // the call's timeout, exactly now
		select {
		case <-returned:
		case <-time.After(2 * time.Second):
		}
	}})
	_, err = exec.Execute(ctx, tools.Request{Tool: "t", Key: "k123", Args: json.RawMessage(`{}`), ToolUseID: "toolu_1"})
	close(returned)
	if outcome, te := tools.Classify(err); outcome != tools.Ambiguous {
		t.Fatalf("a call the downstream acted on came back %s (%v)", outcome, te)
	}
}

// TestHTTPCallAnsweredSeeOtherIsNeverNotSent: a downstream that processed a
// write answers 303 and goes away before its answer can be fetched. The
// GET finds nothing to connect to, but the call was processed: ambiguous,
// never not sent.
func TestHTTPCallAnsweredSeeOtherIsNeverNotSent(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		readRequest(c)
		l.Close() // the answer's GET finds nobody listening
		fmt.Fprint(c, "HTTP/1.1 303 See Other\r\nLocation: /v1/payments/pay_1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
		c.Close()
	}()
	_, outcome, te := call(t, httpTool(t, tools.UnkeyedWrite, "POST", "http://"+l.Addr().String()+"/v1/payments", 2*time.Second), `{"a":1}`)
	if outcome != tools.Ambiguous {
		t.Fatalf("a processed call came back %s (%v)", outcome, te)
	}
}

// TestTheKeyGoesWhereAndAsTheAPIWantsIt: the key is an RFC 8941 string in
// Idempotency-Key by default, the bare key with idempotency_form raw (as
// Stripe-style APIs want: they keep quotes as part of the key), or a
// member of the body (a query parameter of a GET) with
// idempotency_body_field; args that already have that member are refused,
// and a registry that puts the key in two places does not load.
func TestTheKeyGoesWhereAndAsTheAPIWantsIt(t *testing.T) {
	t.Parallel()
	type seen struct{ header, custom, body, query string }
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Header.Get("Idempotency-Key"), r.Header.Get("X-Request-Key"), string(body), r.URL.RawQuery}
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	for _, c := range []struct {
		name string
		spec string
		args string
		want seen
	}{
		{"structured by default", `{method: POST, url: "URL"}`, `{"a":1}`, seen{header: `"k123"`, body: `{"a":1}`}},
		{"raw", `{method: POST, url: "URL", idempotency_form: raw}`, `{"a":1}`, seen{header: `k123`, body: `{"a":1}`}},
		{"raw in another header", `{method: POST, url: "URL", idempotency_header: X-Request-Key, idempotency_form: raw}`, `{"a":1}`, seen{custom: `k123`, body: `{"a":1}`}},
		{"in the body", `{method: POST, url: "URL", idempotency_body_field: idempotency_key}`, `{"a":1}`, seen{body: `{"a":1,"idempotency_key":"k123"}`}},
		{"in an empty body", `{method: PUT, url: "URL", idempotency_body_field: idempotency_key}`, `{}`, seen{body: `{"idempotency_key":"k123"}`}},
		{"in the query of a GET", `{method: GET, url: "URL", idempotency_body_field: request_id}`, `{"q":"x"}`, seen{query: `q=x&request_id=k123`}},
	} {
		reg, err := tools.Parse([]byte("tools:\n  - name: t\n    class: keyed_write\n    schema: {type: object}\n    http: "+strings.ReplaceAll(c.spec, "URL", srv.URL)+"\n"), "reg.yaml", tools.Config{})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		tool, _ := reg.Lookup("t")
		if _, outcome, te := call(t, tool, c.args); outcome != tools.Success {
			t.Fatalf("%s: %s %v", c.name, outcome, te)
		}
		if s := <-got; s != c.want {
			t.Errorf("%s: the downstream saw %+v, want %+v", c.name, s, c.want)
		}
	}
	reg, err := tools.Parse([]byte("tools:\n  - name: t\n    class: keyed_write\n    schema: {type: object}\n    http: {method: POST, url: \""+srv.URL+"\", idempotency_body_field: a}\n"), "reg.yaml", tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("t")
	if _, outcome, te := call(t, tool, `{"a":1}`); outcome != tools.Definite || te.Code != "invalid_args" || len(got) != 0 {
		t.Fatalf("args with the key's member: %s %v, want definite invalid_args and nothing sent", outcome, te)
	}
	// Nor may a member a lenient parser takes for the key's (case, Unicode
	// folding, separators, PHP's []) replace it: such args are refused
	// before the call is claimed (Validate), and never sent.
	reg, err = tools.Parse([]byte("tools:\n  - name: t\n    class: keyed_write\n    schema: {type: object}\n    http: {method: POST, url: \""+srv.URL+"\", idempotency_body_field: idempotency_key}\n"), "reg.yaml", tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ = reg.Lookup("t")
	for _, args := range []string{`{"IDEMPOTENCY_KEY":"victim","a":1}`, `{"Idempotency_Key":"victim"}`, "{\"idempotency_\u212aey\":\"victim\"}",
		`{"idempotencyKey":"victim"}`, `{"idempotency-key":"victim"}`, `{"idempotency.key":"victim"}`, `{"idempotency_key[]":"victim"}`} {
		if err := tool.Validate(json.RawMessage(args)); !errors.Is(err, tools.ErrInvalidArgs) {
			t.Errorf("args %s: Validate %v, want invalid args", args, err)
		}
		if _, outcome, te := call(t, tool, args); outcome != tools.Definite || te.Code != "invalid_args" || len(got) != 0 {
			t.Errorf("args %s: %s %v, want refused unsent", args, outcome, te)
		}
	}
	if err := tool.Validate(json.RawMessage(`{"idempotency_note":"x","key":"y"}`)); err != nil {
		t.Errorf("args with other members: %v", err)
	}
	for spec, want := range map[string]string{
		`{method: POST, url: "http://a/b", idempotency_header: Host}`:                                       "HTTP itself writes that header",
		`{method: POST, url: "http://a/b", idempotency_header: Content-Length}`:                             "HTTP itself writes that header",
		`{method: POST, url: "http://a/b", idempotency_header: Transfer-Encoding}`:                          "HTTP itself writes that header",
		`{method: POST, url: "http://a/b", idempotency_header: "Idempotency Key"}`:                          "not a valid header name",
		`{method: POST, url: "http://a/b", idempotency_body_field: k, idempotency_form: raw}`:               "a body field carries the key as a plain string",
		`{method: POST, url: "http://a/b", idempotency_header: "-", idempotency_form: raw}`:                 "no key is sent",
		`{method: POST, url: "http://a/b", idempotency_form: quoted}`:                                       "idempotency_form",
		`{method: POST, url: "http://a/b", idempotency_body_field: k, idempotency_header: Idempotency-Key}`: "the key goes in one place",
	} {
		if _, err := tools.Parse([]byte("tools:\n  - name: t\n    class: keyed_write\n    schema: {type: object}\n    http: "+spec+"\n"), "reg.yaml", tools.Config{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", spec, err, want)
		}
	}
}

// writeCounter is a connection that counts its writes.
type writeCounter struct {
	net.Conn
	writes *atomic.Int32
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestACallGoesOutInOneWrite: a call's headers and body reach the
// downstream in one write, not the headers first and the body after (two
// packets, and a downstream woken twice, on every call), and the body
// arrives whole. (A request larger than the transport's write buffer, 4
// KiB by default, takes more writes whatever its body.)
func TestACallGoesOutInOneWrite(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(string(b))
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer srv.Close()
	var writes atomic.Int32
	transport := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{Conn: c, writes: &writes}, nil
	}}
	defer transport.CloseIdleConnections()
	exec, err := tools.HTTPExecutor(tools.HTTP{Method: "POST", URL: srv.URL + "/v1/pay", Client: &http.Client{Transport: transport}})
	if err != nil {
		t.Fatal(err)
	}
	for i, args := range []string{`{}`, `{"invoice_id":"inv_1","amount_cents":500,"note":"` + strings.Repeat("é", 1000) + `"}`} {
		before := writes.Load()
		if _, err := exec.Execute(context.Background(), tools.Request{Tool: "t", Key: fmt.Sprintf("k%d", i), Args: json.RawMessage(args)}); err != nil {
			t.Fatal(err)
		}
		if n := writes.Load() - before; n != 1 {
			t.Errorf("call %d (%d bytes of args) went out in %d writes, want 1", i, len(args), n)
		}
		if s, _ := got.Load().(string); s != args {
			t.Errorf("call %d: the downstream got %q, want %q", i, s, args)
		}
	}
}

// TestEveryHTTPCallIsMeasured: each call is recorded in
// http.client.request.duration, and its body's size in
// http.client.request.body.size, through the global meter provider.
// Not parallel: it sets the global meter provider. (OpenTelemetry's
// default global provider forwards, once one is set, to the first one set:
// HTTP executors made after this test record into its reader.)
func TestEveryHTTPCallIsMeasured(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	defer otel.SetMeterProvider(prev)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer srv.Close()
	exec, err := tools.HTTPExecutor(tools.HTTP{Method: "POST", URL: srv.URL + "/v1/pay"})
	if err != nil {
		t.Fatal(err)
	}
	args := []string{`{"a":1}`, `{"b":"` + strings.Repeat("x", 5000) + `"}`, `{}`}
	var size int64
	for i, a := range args {
		size += int64(len(a))
		if _, err := exec.Execute(context.Background(), tools.Request{Tool: "t", Key: fmt.Sprintf("k%d", i), Args: json.RawMessage(a)}); err != nil {
			t.Fatal(err)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts, sums := map[string]uint64{}, map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					counts[m.Name] += p.Count
					sums[m.Name] += p.Sum
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					counts[m.Name] += p.Count
					sums[m.Name] += float64(p.Sum)
				}
			}
		}
	}
	if n := counts["http.client.request.duration"]; n != uint64(len(args)) {
		t.Errorf("http.client.request.duration has %d calls, want %d (all: %v)", n, len(args), counts)
	}
	if n, sum := counts["http.client.request.body.size"], sums["http.client.request.body.size"]; n != uint64(len(args)) || sum != float64(size) {
		t.Errorf("http.client.request.body.size has %d calls summing %v bytes, want %d summing %d", n, sum, len(args), size)
	}
}
