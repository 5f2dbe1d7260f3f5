// Package inbox is the approvals inbox: a small web page, served from the
// binary, where people decide the calls awaiting their approval
// (consumer --approvals-listen). It lists the calls awaiting approval
// with the tool, the args as values one per line and as the exact
// canonical JSON that runs, their digest, the conversation and turn and
// the time left; Approve and Deny take a reason; the list follows the
// approvals stream live; decided calls are in a history.
//
// Every decision goes through approvals.Service.Decide, in the name of
// an approver and for the groups they approve for: an approver logs in
// with a token of their own (LoadApprovers) and sees and decides only
// calls of their groups. Without approvers, an inbox acts as one trusted
// operator (Config.Operator) and answers only on localhost.
//
// The page is same-origin only: decisions and logins are POSTs of JSON
// whose Origin (or Sec-Fetch-Site) must be the inbox's own, and decisions
// carry the session's CSRF token; the session cookie is HttpOnly and
// SameSite=Strict. The Content-Security-Policy allows the inbox's own
// script and nothing else, and the page renders every value of a call as
// text: args are a model's output.
package inbox

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// Config configures an Inbox.
type Config struct {
	Approvals *approvals.Service
	Ledger    *ledger.Store
	// Approvers log in with their token (LoadApprovers). Without any, the
	// inbox acts as Operator, with no login, and answers only requests
	// sent to localhost (a page of another site cannot reach it by a name
	// that resolves there); serve it on a loopback address.
	Approvers []Approver
	Operator  *Approver
	// Conn, when set, tells the pages of the approvals stream's events as
	// they come; the ledger is polled every Poll (default 2s) while a page
	// is open either way.
	Conn *nats.Conn
	Poll time.Duration
	// SessionTTL is how long a login lasts (default 12h).
	SessionTTL time.Duration
	// ListLimit is how many calls each list shows (default 200): the
	// pending calls that expire first, the latest decisions; the page
	// says how many more there are.
	ListLimit int
	Logger    *slog.Logger
}

// Inbox serves the approvals inbox (Handler). Close it when done.
type Inbox struct {
	cfg      Config
	log      *slog.Logger
	sessions sessions
	throttle *throttle
	hub      hub
	assets   fs.FS
	sub      *nats.Subscription
	stop     context.CancelFunc
	done     chan struct{} // closed by Close: the event streams end
	closing  sync.Once
	polled   sync.WaitGroup
}

//go:embed assets
var embedded embed.FS

// maxListed is how many calls a list shows by default.
const maxListed = 200

// New returns an Inbox. Errors: a configuration without its ledger or
// service, with both approvers and an operator or neither, or one whose
// approvers do not check out.
func New(cfg Config) (*Inbox, error) {
	switch {
	case cfg.Approvals == nil || cfg.Ledger == nil:
		return nil, errors.New("inbox: the approvals service and the ledger are required")
	case len(cfg.Approvers) > 0 && cfg.Operator != nil:
		return nil, errors.New("inbox: approvers with tokens, or one operator without, not both")
	case len(cfg.Approvers) == 0 && cfg.Operator == nil:
		return nil, errors.New("inbox: no approvers: give approvers with tokens, or the operator it acts as")
	}
	for i := range cfg.Approvers {
		if err := cfg.Approvers[i].check(); err != nil {
			return nil, fmt.Errorf("inbox: approver %q: %w", cfg.Approvers[i].Name, err)
		}
	}
	if cfg.Operator != nil {
		if err := cfg.Operator.check(); err != nil {
			return nil, fmt.Errorf("inbox: operator %q: %w", cfg.Operator.Name, err)
		}
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 2 * time.Second
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.ListLimit <= 0 {
		cfg.ListLimit = maxListed
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	assets, err := fs.Sub(embedded, "assets")
	if err != nil {
		return nil, err
	}
	in := &Inbox{cfg: cfg, log: cfg.Logger, assets: assets, done: make(chan struct{}),
		sessions: sessions{ttl: cfg.SessionTTL, m: map[string]*session{}}, throttle: newThrottle(time.Now),
		hub: hub{subs: map[chan change][]string{}, last: map[string]string{}}}
	if cfg.Conn != nil {
		if in.sub, err = cfg.Conn.Subscribe(jobs.ApprovalsSubjects, in.hub.event); err != nil {
			return nil, fmt.Errorf("inbox: subscribe to %s: %w", jobs.ApprovalsSubjects, err)
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	in.stop = stop
	in.polled.Go(func() {
		in.hub.run(ctx, cfg.Ledger, cfg.Poll, cfg.ListLimit, func(err error) {
			in.log.Warn("approvals inbox: reading the ledger failed; the pages are told again at the next poll", "error", err)
		})
	})
	return in, nil
}

// Close ends the pages' event streams and the inbox's polling. It is
// idempotent; stop the HTTP server too.
func (in *Inbox) Close() {
	in.closing.Do(func() {
		close(in.done)
		in.stop()
		if in.sub != nil {
			in.sub.Unsubscribe()
		}
		in.polled.Wait()
	})
}

// Handler is the inbox: the page at /, its assets, and its JSON API under
// /api/ (session, login, logout, pending, history, decide, events).
func (in *Inbox) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", in.asset("index.html"))
	mux.HandleFunc("GET /app.js", in.asset("app.js"))
	mux.HandleFunc("GET /app.css", in.asset("app.css"))
	mux.HandleFunc("GET /api/session", in.getSession)
	mux.HandleFunc("POST /api/login", in.login)
	mux.HandleFunc("POST /api/logout", in.logout)
	mux.HandleFunc("GET /api/pending", in.authed(in.pending))
	mux.HandleFunc("GET /api/history", in.authed(in.history))
	mux.HandleFunc("GET /api/events", in.authed(in.events))
	mux.HandleFunc("POST /api/decide", in.authed(in.decide))
	return in.guard(mux)
}

// csp lets the page load its own script and style and nothing else, and no
// page frame it.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// guard sets the headers of every response, refuses the API to a page of
// another site, and, for an operator's inbox, any request not sent to
// localhost.
func (in *Inbox) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		if in.cfg.Operator != nil && !Loopback(r.Host) {
			fail(w, http.StatusMisdirectedRequest, "not_local", "this inbox acts as "+in.cfg.Operator.Name+" without a login: it answers only on localhost")
			return
		}
		// The page itself may be linked to from anywhere; its API is its own.
		if strings.HasPrefix(r.URL.Path, "/api/") && !sameOrigin(r, r.Method != http.MethodGet && r.Method != http.MethodHead) {
			fail(w, http.StatusForbidden, "cross_site", "refused: the request does not come from the inbox's own page")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (in *Inbox) asset(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := fs.ReadFile(in.assets, name)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		ctype := mime.TypeByExtension(name[strings.LastIndexByte(name, '.'):])
		if strings.HasSuffix(name, ".js") {
			ctype = "text/javascript; charset=utf-8"
		}
		w.Header().Set("Content-Type", ctype)
		w.Write(body)
	}
}

// me is who the page acts as.
type me struct {
	Name     string   `json:"name"`
	Groups   []string `json:"groups"`
	CSRF     string   `json:"csrf"`
	Operator bool     `json:"operator"` // no login: the inbox's one operator
}

// getSession says who the page acts as (401: nobody yet, log in); an
// operator's inbox starts a session for its operator.
func (in *Inbox) getSession(w http.ResponseWriter, r *http.Request) {
	x := in.sessions.of(r)
	if x == nil && in.cfg.Operator != nil {
		x = in.sessions.create(in.cfg.Operator)
		setCookie(w, r, x)
	}
	if x == nil {
		fail(w, http.StatusUnauthorized, "login", "log in with your approver token")
		return
	}
	reply(w, http.StatusOK, me{Name: x.approver.Name, Groups: x.approver.Groups, CSRF: x.csrf, Operator: in.cfg.Operator != nil})
}

// login takes {"token": "…"} and starts the session of its approver.
func (in *Inbox) login(w http.ResponseWriter, r *http.Request) {
	if in.cfg.Operator != nil {
		fail(w, http.StatusBadRequest, "no_login", "this inbox acts as "+in.cfg.Operator.Name+" without a login")
		return
	}
	var req struct {
		Token string `json:"token"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	from := clientOf(r)
	if wait := in.throttle.attempt(from); wait > 0 {
		in.refused(r, true)
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		fail(w, http.StatusTooManyRequests, "throttled", fmt.Sprintf("too many logins with unknown tokens: try again in %s", wait.Round(time.Second)))
		return
	}
	a := match(in.cfg.Approvers, req.Token)
	if a == nil {
		in.refused(r, false)
		fail(w, http.StatusUnauthorized, "bad_token", "no approver has this token")
		return
	}
	in.throttle.succeeded(from)
	if old := in.sessions.of(r); old != nil {
		in.sessions.end(old)
	}
	x := in.sessions.create(a)
	setCookie(w, r, x)
	in.log.Info("approvals inbox: an approver logged in", "by", a.Name, "remote", r.RemoteAddr)
	reply(w, http.StatusOK, me{Name: a.Name, Groups: a.Groups, CSRF: x.csrf})
}

func (in *Inbox) logout(w http.ResponseWriter, r *http.Request) {
	if x := in.sessions.of(r); x != nil {
		if !csrfOK(r, x) {
			fail(w, http.StatusForbidden, "csrf", "refused: the request lacks the session's CSRF token")
			return
		}
		in.sessions.end(x)
	}
	setCookie(w, r, nil)
	w.WriteHeader(http.StatusNoContent)
}

// authed serves h to a live session alone, and a POST only with the
// session's CSRF token.
func (in *Inbox) authed(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		x := in.sessions.of(r)
		switch {
		case x == nil:
			fail(w, http.StatusUnauthorized, "login", "log in with your approver token")
		case r.Method == http.MethodPost && !csrfOK(r, x):
			fail(w, http.StatusForbidden, "csrf", "refused: the request lacks the session's CSRF token")
		default:
			h(w, r, x)
		}
	}
}

// list is the answer of pending and history; Now is the server's clock,
// which the page counts the time left by, and More how many calls the
// list leaves out.
type list struct {
	Now   time.Time `json:"now"`
	Calls []call    `json:"calls"`
	More  int64     `json:"more"`
}

// pending lists the calls awaiting the approval of the session's groups,
// the first to expire first.
func (in *Inbox) pending(w http.ResponseWriter, r *http.Request, x *session) {
	in.list(w, r, ledger.Filter{State: ledger.AwaitingApproval, Groups: x.approver.Groups, Order: ledger.OldestExpiryFirst})
}

// history lists the decided calls of the session's groups, the latest
// decision first, with the approved calls that have not run yet.
func (in *Inbox) history(w http.ResponseWriter, r *http.Request, x *session) {
	in.list(w, r, ledger.Filter{Approval: "decided", Groups: x.approver.Groups, Order: ledger.LatestDecisionFirst})
}

// list answers with the calls f selects, the first ListLimit of them, and
// how many more there are.
func (in *Inbox) list(w http.ResponseWriter, r *http.Request, f ledger.Filter) {
	f.Limit = in.cfg.ListLimit
	rows, err := in.cfg.Ledger.List(r.Context(), f)
	if err != nil {
		in.ledgerFailed(w, err)
		return
	}
	out := list{Now: time.Now().UTC(), Calls: []call{}}
	for _, row := range rows {
		out.Calls = append(out.Calls, view(row))
	}
	if len(rows) == f.Limit {
		total, err := in.cfg.Ledger.Total(r.Context(), f)
		if err != nil {
			in.ledgerFailed(w, err)
			return
		}
		out.More = max(0, total-int64(len(rows)))
	}
	reply(w, http.StatusOK, out)
}

var (
	keyPattern    = regexp.MustCompile(`^[0-9a-f]{32}$`)
	digestPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// decision is the body of POST /api/decide: the digest is the one of the
// args the approver saw, and the ledger refuses the decision for any
// other.
type decision struct {
	Key      string `json:"key"`
	Decision string `json:"decision"` // approve or deny
	Reason   string `json:"reason"`
	Digest   string `json:"digest"`
}

// decided answers a decision: the call's approval as it stands.
type decided struct {
	Key    string `json:"key"`
	Status string `json:"status"`
	Call   *call  `json:"call,omitempty"`
}

// decide records the session's approver's decision on one call of their
// groups. Refusals: 400 (a bad request, an empty reason), 403 (another
// group's call), 404 (no such call), 409 (no longer awaiting, a digest of
// other args, or an approval of args that do not hash to the call's
// digest), 503 (the ledger did not answer).
func (in *Inbox) decide(w http.ResponseWriter, r *http.Request, x *session) {
	var d decision
	if !readJSON(w, r, &d) {
		return
	}
	d.Reason = strings.TrimSpace(d.Reason)
	switch {
	case !keyPattern.MatchString(d.Key):
		fail(w, http.StatusBadRequest, "bad_request", "key: want 32 lowercase hexadecimal characters")
		return
	case d.Decision != "approve" && d.Decision != "deny":
		fail(w, http.StatusBadRequest, "bad_request", `decision: want "approve" or "deny"`)
		return
	case d.Reason == "":
		fail(w, http.StatusBadRequest, "bad_request", "a reason is required: it is recorded with the decision")
		return
	case len(d.Reason) > ledger.MaxDecisionReason:
		fail(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("reason: at most %d bytes", ledger.MaxDecisionReason))
		return
	case !digestPattern.MatchString(d.Digest):
		fail(w, http.StatusBadRequest, "bad_request", "digest: want the args digest shown with the call (64 hexadecimal characters)")
		return
	}
	// A decision is finished once begun, even if the page goes away.
	ctx := context.WithoutCancel(r.Context())
	// An approved call not run yet is found too (released): a second
	// decision on it is refused naming the approval.
	row, err := in.cfg.Ledger.GetOrApproved(ctx, d.Key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		fail(w, http.StatusNotFound, "not_found", "no call has this key")
		return
	case err != nil:
		in.ledgerFailed(w, err)
		return
	case row.Approval == nil:
		fail(w, http.StatusConflict, "not_awaiting", "this call never needed approval")
		return
	case !x.approver.Decides(row.Approval.Group):
		fail(w, http.StatusForbidden, "group", fmt.Sprintf("this call is for an approver of group %q; %s approves for %s",
			row.Approval.Group, x.approver.Name, strings.Join(x.approver.Groups, ", ")))
		return
	}
	if d.Decision == "approve" && !view(row).ArgsVerified {
		fail(w, http.StatusConflict, "unverified", "the args of this call do not hash to its digest, so the inbox cannot show what would run: "+
			"deny it, or decide it with the consumer's approve command after reading its ledger row")
		return
	}
	row, err = in.cfg.Approvals.Decide(ctx, d.Key, ledger.Decision{Approve: d.Decision == "approve", By: x.approver.Name,
		Reason: d.Reason, Group: row.Approval.Group, Digest: d.Digest})
	switch {
	case err == nil:
		v := view(row)
		reply(w, http.StatusOK, decided{Key: d.Key, Status: string(row.ApprovalStatus), Call: &v})
	case errors.Is(err, ledger.ErrNotFound):
		fail(w, http.StatusNotFound, "not_found", "no call has this key")
	case errors.Is(err, ledger.ErrInvalidDecision):
		fail(w, http.StatusBadRequest, "bad_request", err.Error())
	case errors.Is(err, ledger.ErrNotAwaiting):
		fail(w, http.StatusConflict, "not_awaiting", err.Error())
	case errors.Is(err, ledger.ErrDecisionRefused):
		fail(w, http.StatusConflict, "refused", err.Error())
	default:
		in.ledgerFailed(w, err)
	}
}

// events is a stream of Server-Sent Events: a "change" whenever the calls
// of the session's groups may have changed (the page reads its lists
// again), and a comment every 20 s to keep the connection open. It ends
// with the session or the inbox.
func (in *Inbox) events(w http.ResponseWriter, r *http.Request, x *session) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		fail(w, http.StatusInternalServerError, "no_stream", "this server cannot stream events")
		return
	}
	ch := in.hub.subscribe(x.approver.Groups)
	defer in.hub.unsubscribe(ch)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, "retry: 2000\n\n")
	flusher.Flush()
	keepalive := time.NewTicker(20 * time.Second)
	defer keepalive.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-in.done:
			return
		case <-keepalive.C:
			if !in.sessions.live(x) {
				return
			}
			io.WriteString(w, ": keepalive\n\n")
		case c := <-ch:
			if !in.sessions.live(x) {
				return
			}
			if c.Group != "" && !x.approver.Decides(c.Group) {
				continue
			}
			data, _ := json.Marshal(c)
			fmt.Fprintf(w, "event: change\ndata: %s\n\n", data)
		}
		flusher.Flush()
	}
}

func (in *Inbox) ledgerFailed(w http.ResponseWriter, err error) {
	in.log.Warn("approvals inbox: the ledger did not answer", "error", err)
	fail(w, http.StatusServiceUnavailable, "unavailable", "the ledger did not answer; try again")
}

// maxBody is the largest request body read.
const maxBody = 64 << 10

// readJSON decodes r's JSON body into v, or refuses it.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		fail(w, http.StatusUnsupportedMediaType, "bad_request", "want Content-Type: application/json")
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.Decode(new(json.RawMessage)) != io.EOF {
		err = errors.New("data after the JSON value") // two requests are no request
	}
	if err != nil {
		fail(w, http.StatusBadRequest, "bad_request", "want a JSON body: "+err.Error())
		return false
	}
	return true
}

// apiError is the body of every refusal.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func fail(w http.ResponseWriter, status int, code, message string) {
	var e apiError
	e.Error.Code, e.Error.Message = code, message
	reply(w, status, e)
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
