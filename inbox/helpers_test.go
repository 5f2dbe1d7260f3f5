package inbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/inbox"
	"github.com/toolq/toolq/ledger"
)

// The approvers of the tests: alice approves payments, oscar operations.
const (
	aliceToken = "alice-token-0123456789abcdef"
	oscarToken = "oscar-token-0123456789abcdef"
)

func approver(name, token string, groups ...string) inbox.Approver {
	return inbox.Approver{Name: name, Groups: groups, TokenSHA256: sha256.Sum256([]byte(token))}
}

// bundle is what a test of the inbox needs.
type bundle struct {
	store *ledger.Store
	appr  *approvals.Service
	inbox *inbox.Inbox
	srv   *httptest.Server
}

// setup starts an inbox for alice and oscar (or cfg's approvers or
// operator) on a SQLite ledger, behind an HTTP server; both stop when the
// test ends. Its logger is quiet unless cfg has one.
func setup(t *testing.T, cfg inbox.Config) *bundle {
	t.Helper()
	ctx := context.Background()
	store, err := ledger.Open(ctx, "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	appr, err := approvals.New(approvals.Config{Ledger: store, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Ledger, cfg.Approvals = store, appr
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	if cfg.Operator == nil && cfg.Approvers == nil {
		cfg.Approvers = []inbox.Approver{approver("alice", aliceToken, "finance"), approver("oscar", oscarToken, "ops")}
	}
	in, err := inbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(in.Handler())
	t.Cleanup(func() { in.Close(); srv.Close() })
	return &bundle{store: store, appr: appr, inbox: in, srv: srv}
}

var seq atomic.Int64

// awaiting records a call of group with args awaiting approval for an
// hour, and returns its row.
func (b *bundle) awaiting(t *testing.T, group, args string) ledger.Row {
	t.Helper()
	return b.awaitingFor(t, group, args, time.Hour)
}

// awaitingFor records a call awaiting approval for ttl.
func (b *bundle) awaitingFor(t *testing.T, group, args string, ttl time.Duration) ledger.Row {
	t.Helper()
	digest := sha256.Sum256([]byte(args))
	return b.awaitingDigest(t, group, args, hex.EncodeToString(digest[:]), ttl)
}

// awaitingDigest records a call whose args digest is digest.
func (b *bundle) awaitingDigest(t *testing.T, group, args, digest string, ttl time.Duration) ledger.Row {
	t.Helper()
	ctx := context.Background()
	n := seq.Add(1)
	key := make([]byte, 16)
	rand.Read(key)
	res, err := b.store.Claim(ctx, []ledger.Claim{{Key: hex.EncodeToString(key), ConversationID: "conv-inbox", TurnIndex: n,
		Tool: "send_payment", ArgsDigest: digest, ToolUseID: "toolu_" + hex.EncodeToString(key[:4]),
		Owner: "test", Lease: time.Minute, Token: rand.Text()}})
	if err != nil || res[0].Err != nil || !res[0].Claimed {
		t.Fatalf("claim: %v %+v", err, res)
	}
	row, err := b.store.AwaitApproval(ctx, res[0].Row.Fence(), ledger.ApprovalInfo{Args: json.RawMessage(args), Group: group, TTL: ttl},
		res[0].Row.FirstToolUseID)
	if err != nil {
		t.Fatal(err)
	}
	return row
}

// browser is a client of the inbox as its page is: a cookie jar, the
// inbox's own Origin, and the session's CSRF token once logged in.
type browser struct {
	t      *testing.T
	base   string
	client *http.Client
	csrf   string
	// header is added to every request (a test's Origin, Host).
	header http.Header
	host   string
}

func (b *bundle) browser(t *testing.T) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: b.srv.URL, client: &http.Client{Jar: jar}, header: http.Header{"Origin": {b.srv.URL}}}
}

// response is an answer of the inbox.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) code() string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	json.Unmarshal(r.body, &e)
	return e.Error.Code
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
}

// do sends a request; a body is JSON, and a POST carries the CSRF token.
func (br *browser) do(method, path string, body any) response {
	br.t.Helper()
	var rd io.Reader
	if body != nil {
		raw, ok := body.([]byte) // a body as it is sent
		if !ok {
			raw, _ = json.Marshal(body)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, br.base+path, rd)
	if err != nil {
		br.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if method == http.MethodPost && br.csrf != "" {
		req.Header.Set("X-Toolq-Csrf", br.csrf)
	}
	for k, v := range br.header {
		req.Header[k] = v
	}
	if br.host != "" {
		req.Host = br.host
	}
	res, err := br.client.Do(req)
	if err != nil {
		br.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: raw}
}

// login logs in with token and keeps the session's CSRF token.
func (br *browser) login(token string) {
	br.t.Helper()
	res := br.do(http.MethodPost, "/api/login", map[string]string{"token": token})
	if res.status != http.StatusOK {
		br.t.Fatalf("login: %d %s", res.status, res.body)
	}
	var me struct{ CSRF string }
	res.decode(br.t, &me)
	br.csrf = me.CSRF
}

// listed is an answer of /api/pending or /api/history.
type listed struct {
	Now   time.Time `json:"now"`
	More  int64     `json:"more"`
	Calls []struct {
		Key        string   `json:"key"`
		Tool       string   `json:"tool"`
		Group      string   `json:"group"`
		Args       string   `json:"args"`
		ArgsShown  string   `json:"args_shown"`
		ArgsPretty string   `json:"args_pretty"`
		ArgsDigest string   `json:"args_digest"`
		Verified   bool     `json:"args_verified"`
		Unseen     bool     `json:"unseen"`
		Lookalikes []string `json:"lookalikes"`
		Fields     []struct {
			Path, Value, Kind string
			Hidden            bool
		} `json:"fields"`
		ExpiresAt time.Time `json:"expires_at"`
		State     string    `json:"state"`
		Decision  string    `json:"decision"`
		By        string    `json:"by"`
		Reason    string    `json:"reason"`
	} `json:"calls"`
}

func (br *browser) list(path string) listed {
	br.t.Helper()
	res := br.do(http.MethodGet, path, nil)
	if res.status != http.StatusOK {
		br.t.Fatalf("%s: %d %s", path, res.status, res.body)
	}
	var l listed
	res.decode(br.t, &l)
	return l
}

func keysOf(l listed) string {
	var keys []string
	for _, c := range l.Calls {
		keys = append(keys, c.Key)
	}
	return strings.Join(keys, ",")
}

func decide(key, decision, reason, digest string) map[string]string {
	return map[string]string{"key": key, "decision": decision, "reason": reason, "digest": digest}
}
