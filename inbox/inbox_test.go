package inbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolq/toolq/inbox"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// TestAnApproverDecidesTheCallsOfTheirGroupsInTheirName: alice logs in
// with her token, sees the finance call and not the ops one, approves it
// with a reason; the ledger records her decision, and the call leaves her
// pending list for her history.
func TestAnApproverDecidesTheCallsOfTheirGroupsInTheirName(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	pay := b.awaiting(t, "finance", `{"amount_cents":90000,"to":"acct_9"}`)
	ops := b.awaiting(t, "ops", `{"amount_cents":70000,"to":"acct_1"}`)
	br := b.browser(t)
	br.login(aliceToken)

	var me struct {
		Name   string
		Groups []string
	}
	br.do(http.MethodGet, "/api/session", nil).decode(t, &me)
	if me.Name != "alice" || strings.Join(me.Groups, ",") != "finance" {
		t.Fatalf("session: %+v", me)
	}
	pending := br.list("/api/pending")
	if keysOf(pending) != pay.Key {
		t.Fatalf("alice's pending calls: %s, want only the finance call %s (not ops's %s)", keysOf(pending), pay.Key, ops.Key)
	}
	c := pending.Calls[0]
	if c.Args != `{"amount_cents":90000,"to":"acct_9"}` || c.ArgsDigest != pay.ArgsDigest || c.Group != "finance" ||
		c.ArgsPretty != "{\n  \"amount_cents\": 90000,\n  \"to\": \"acct_9\"\n}" || !c.ExpiresAt.Equal(pay.ApprovalExpiresAt) {
		t.Fatalf("the call as shown: %+v", c)
	}
	if d := c.ExpiresAt.Sub(pending.Now); d < 59*time.Minute || d > time.Hour {
		t.Fatalf("time left by the server's clock: %s", d)
	}
	res := br.do(http.MethodPost, "/api/decide", decide(pay.Key, "approve", "  invoice 42 checked  ", c.ArgsDigest))
	if res.status != http.StatusOK || !strings.Contains(string(res.body), `"status":"approved"`) {
		t.Fatalf("decide: %d %s", res.status, res.body)
	}
	if p := br.list("/api/pending"); len(p.Calls) != 0 {
		t.Fatalf("still pending: %s", keysOf(p))
	}
	// The approved call is released until a worker claims it to run it.
	if _, err := b.store.Claim(context.Background(), []ledger.Claim{{Key: pay.Key, ConversationID: pay.ConversationID, TurnIndex: pay.TurnIndex,
		Tool: pay.Tool, ArgsDigest: pay.ArgsDigest, ToolUseID: pay.FirstToolUseID, Owner: "test", Lease: time.Minute, Token: "t2"}}); err != nil {
		t.Fatal(err)
	}
	row, err := b.store.Get(context.Background(), pay.Key)
	if err != nil {
		t.Fatal(err)
	}
	d := row.LastDecision()
	if row.ApprovalStatus != ledger.ApprovalApproved || d == nil || d.By != "alice" || d.Reason != "invoice 42 checked" ||
		d.Group != "finance" || d.Digest != pay.ArgsDigest {
		t.Fatalf("the ledger's decision: %s %+v", row.ApprovalStatus, d)
	}
	h := br.list("/api/history")
	if keysOf(h) != pay.Key || h.Calls[0].Decision != "approved" || h.Calls[0].By != "alice" || h.Calls[0].Reason != "invoice 42 checked" {
		t.Fatalf("history: %+v", h.Calls)
	}
}

// TestTheInboxAsksForALogin: without a session the API answers 401, a
// wrong token logs nobody in, and a logout ends the session.
func TestTheInboxAsksForALogin(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	call := b.awaiting(t, "finance", `{"amount_cents":90000}`)
	br := b.browser(t)
	for _, path := range []string{"/api/session", "/api/pending", "/api/history", "/api/events"} {
		if res := br.do(http.MethodGet, path, nil); res.status != http.StatusUnauthorized {
			t.Fatalf("%s without a login: %d %s", path, res.status, res.body)
		}
	}
	if res := br.do(http.MethodPost, "/api/decide", decide(call.Key, "approve", "ok", call.ArgsDigest)); res.status != http.StatusUnauthorized {
		t.Fatalf("decide without a login: %d", res.status)
	}
	if res := br.do(http.MethodPost, "/api/login", map[string]string{"token": aliceToken + "x"}); res.status != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d %s", res.status, res.body)
	}
	if res := br.do(http.MethodGet, "/", nil); res.status != http.StatusOK || !strings.Contains(string(res.body), "Approver token") {
		t.Fatalf("the page: %d", res.status)
	}
	br.login(aliceToken)
	if res := br.do(http.MethodPost, "/api/logout", nil); res.status != http.StatusNoContent {
		t.Fatalf("logout: %d %s", res.status, res.body)
	}
	if res := br.do(http.MethodGet, "/api/pending", nil); res.status != http.StatusUnauthorized {
		t.Fatalf("after logout: %d", res.status)
	}
}

// TestADecisionFromAnotherSiteOrWithoutTheCSRFTokenIsRefused: a logged-in
// approver's browser sends the session cookie with any request; a
// decision is taken only from the inbox's own page (its Origin, or
// Sec-Fetch-Site: same-origin) with the session's CSRF token in a header,
// as JSON. The call is still awaiting after every refusal.
func TestADecisionFromAnotherSiteOrWithoutTheCSRFTokenIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	call := b.awaiting(t, "finance", `{"amount_cents":90000}`)
	br := b.browser(t)
	br.login(aliceToken)
	body := decide(call.Key, "approve", "ok", call.ArgsDigest)
	csrf := br.csrf
	cases := []struct {
		name   string
		header http.Header
		csrf   string
		want   int
	}{
		{"no CSRF token", http.Header{"Origin": {b.srv.URL}}, "", http.StatusForbidden},
		{"another CSRF token", http.Header{"Origin": {b.srv.URL}}, csrf[1:] + "A", http.StatusForbidden},
		{"another site's Origin", http.Header{"Origin": {"https://evil.example"}}, csrf, http.StatusForbidden},
		{"another site by Sec-Fetch-Site", http.Header{"Sec-Fetch-Site": {"cross-site"}}, csrf, http.StatusForbidden},
		{"a sibling site by Sec-Fetch-Site", http.Header{"Sec-Fetch-Site": {"same-site"}, "Origin": {b.srv.URL}}, csrf, http.StatusForbidden},
		{"neither Origin nor Sec-Fetch-Site", http.Header{}, csrf, http.StatusForbidden},
		{"Origin null", http.Header{"Origin": {"null"}}, csrf, http.StatusForbidden},
	}
	for _, c := range cases {
		br.header, br.csrf = c.header, c.csrf
		if res := br.do(http.MethodPost, "/api/decide", body); res.status != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, res.status, res.body, c.want)
		}
	}
	// A form's text/plain (no preflight) is refused too.
	br.header, br.csrf = http.Header{"Origin": {b.srv.URL}}, csrf
	req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/api/decide", strings.NewReader(`{"key":"`+call.Key+`"}`))
	req.Header.Set("Content-Type", "text/plain")
	req.Header.Set("Origin", b.srv.URL)
	req.Header.Set("X-Toolq-Csrf", csrf)
	if res, err := br.client.Do(req); err != nil || res.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: %v %v", res.StatusCode, err)
	}
	// A login from another site is refused: nobody is logged in as alice
	// by a page that knows her token's hash.
	other := b.browser(t)
	other.header = http.Header{"Origin": {"https://evil.example"}}
	if res := other.do(http.MethodPost, "/api/login", map[string]string{"token": aliceToken}); res.status != http.StatusForbidden {
		t.Errorf("a login from another site: %d", res.status)
	}
	if row, _ := b.store.Get(context.Background(), call.Key); row.State != ledger.AwaitingApproval {
		t.Fatalf("after the refusals the call is %s", row.State)
	}
	// The same decision from the page itself stands.
	if res := br.do(http.MethodPost, "/api/decide", body); res.status != http.StatusOK {
		t.Fatalf("from the page: %d %s", res.status, res.body)
	}
}

// TestAnApproverCannotDecideAnotherGroupsCall: alice (finance) cannot
// decide an ops call, even knowing its key and digest; oscar (ops) can.
func TestAnApproverCannotDecideAnotherGroupsCall(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ops := b.awaiting(t, "ops", `{"amount_cents":70000}`)
	alice := b.browser(t)
	alice.login(aliceToken)
	res := alice.do(http.MethodPost, "/api/decide", decide(ops.Key, "approve", "looks fine", ops.ArgsDigest))
	if res.status != http.StatusForbidden || res.code() != "group" {
		t.Fatalf("alice on an ops call: %d %s", res.status, res.body)
	}
	if row, _ := b.store.Get(context.Background(), ops.Key); row.State != ledger.AwaitingApproval {
		t.Fatalf("the ops call is %s after alice's refusal", row.State)
	}
	oscar := b.browser(t)
	oscar.login(oscarToken)
	if keysOf(oscar.list("/api/pending")) != ops.Key {
		t.Fatal("oscar does not see the ops call")
	}
	if res := oscar.do(http.MethodPost, "/api/decide", decide(ops.Key, "deny", "not today", ops.ArgsDigest)); res.status != http.StatusOK {
		t.Fatalf("oscar: %d %s", res.status, res.body)
	}
	if h := alice.list("/api/history"); len(h.Calls) != 0 {
		t.Fatalf("alice sees ops's history: %s", keysOf(h))
	}
}

// TestADecisionNeedsAReasonAndTheDigestTheApproverSaw: an empty reason, a
// missing digest and a bad decision are refused (400); a digest of other
// args is refused by the ledger (409); of two decisions only the first
// stands (409 for the second, saying what stood).
func TestADecisionNeedsAReasonAndTheDigestTheApproverSaw(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	call := b.awaiting(t, "finance", `{"amount_cents":90000}`)
	br := b.browser(t)
	br.login(aliceToken)
	other := strings.Repeat("0", 64)
	both := `{"key":"` + call.Key + `","decision":"approve","reason":"ok","digest":"` + call.ArgsDigest + `"}`
	for _, c := range []struct {
		body any
		want int
	}{
		{decide(call.Key, "approve", "", call.ArgsDigest), http.StatusBadRequest},
		{decide(call.Key, "approve", " \n\t ", call.ArgsDigest), http.StatusBadRequest},
		{decide(call.Key, "approve", strings.Repeat("x", 2001), call.ArgsDigest), http.StatusBadRequest},
		{decide(call.Key, "approve", "ok", ""), http.StatusBadRequest},
		{decide(call.Key, "maybe", "ok", call.ArgsDigest), http.StatusBadRequest},
		{decide("not-a-key", "approve", "ok", call.ArgsDigest), http.StatusBadRequest},
		{decide(strings.Repeat("a", 32), "approve", "ok", call.ArgsDigest), http.StatusNotFound},
		{decide(call.Key, "approve", "ok", other), http.StatusConflict},
		{map[string]string{"key": call.Key, "decision": "approve", "reason": "ok", "digest": call.ArgsDigest, "by": "mallory"}, http.StatusBadRequest},
		// Two decisions in one body, an approval then a denial: the first alone must not be taken.
		{[]byte(both + strings.Replace(both, "approve", "deny", 1)), http.StatusBadRequest},
	} {
		if res := br.do(http.MethodPost, "/api/decide", c.body); res.status != c.want {
			t.Errorf("%s: %d %s, want %d", c.body, res.status, res.body, c.want)
		}
	}
	if row, _ := b.store.Get(context.Background(), call.Key); row.State != ledger.AwaitingApproval {
		t.Fatalf("after the refusals the call is %s", row.State)
	}
	if res := br.do(http.MethodPost, "/api/decide", decide(call.Key, "deny", "not on the invoice", call.ArgsDigest)); res.status != http.StatusOK {
		t.Fatalf("deny: %d %s", res.status, res.body)
	}
	res := br.do(http.MethodPost, "/api/decide", decide(call.Key, "approve", "changed my mind", call.ArgsDigest))
	if res.status != http.StatusConflict || res.code() != "not_awaiting" || !strings.Contains(string(res.body), "denied by alice") {
		t.Fatalf("a second decision: %d %s", res.status, res.body)
	}
}

// TestASecondDecisionAfterAnApprovalIsAConflictSayingWhatStood: of two
// approvers deciding one call (a page not refreshed yet), the second must
// get 409 naming the decision that stood (docs/approvals.md; the inbox's
// decide: "409 (no longer awaiting …)"), also after an approval whose call
// has not run yet (its row released, which Ledger.Get does not return),
// not the 404 of a key no call has.
func TestASecondDecisionAfterAnApprovalIsAConflictSayingWhatStood(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{Approvers: []inbox.Approver{approver("alice", aliceToken, "finance"), approver("bob", oscarToken, "finance")}})
	call := b.awaiting(t, "finance", `{"amount_cents":90000}`)
	alice, bob := b.browser(t), b.browser(t)
	alice.login(aliceToken)
	bob.login(oscarToken)
	if res := alice.do(http.MethodPost, "/api/decide", decide(call.Key, "approve", "invoice 42", call.ArgsDigest)); res.status != http.StatusOK {
		t.Fatalf("approve: %d %s", res.status, res.body)
	}
	res := bob.do(http.MethodPost, "/api/decide", decide(call.Key, "deny", "unknown payee", call.ArgsDigest))
	if res.status != http.StatusConflict || res.code() != "not_awaiting" || !strings.Contains(string(res.body), "approved by alice") {
		t.Fatalf("a second decision after an approval: %d %s (want 409 not_awaiting, approved by alice)", res.status, strings.TrimSpace(string(res.body)))
	}
}

// TestArgsAreServedAsTextAndThePageRunsOnlyItsOwnScript: args are a
// model's output. The API gives them as JSON strings (so as data, never
// markup), the exact canonical JSON included; characters that do not show
// are escaped in the values an approver reads; every response forbids
// inline script and framing; the page has no inline script, and its
// script never writes HTML (the browser test renders such args).
func TestArgsAreServedAsTextAndThePageRunsOnlyItsOwnScript(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	args := `{"memo":"\"><img src=x onerror=alert(1)>","note":"<script>alert(1)</script>","to":"acct_9` + "\u202e" + `1"}`
	call := b.awaiting(t, "finance", args)
	br := b.browser(t)
	br.login(aliceToken)
	res := br.do(http.MethodGet, "/api/pending", nil)
	if strings.Contains(string(res.body), "<script>") || strings.Contains(string(res.body), "<img") {
		t.Fatalf("markup in the API's JSON: %s", res.body)
	}
	var l listed
	res.decode(t, &l)
	// The ledger stores them as JSON with <, > and & escaped; the page is
	// given the canonical bytes that were digested.
	if len(l.Calls) != 1 || l.Calls[0].Key != call.Key || l.Calls[0].Args != args || !l.Calls[0].Verified {
		t.Fatalf("the canonical args, exactly: %+v", l.Calls)
	}
	values := map[string]string{}
	hidden := map[string]bool{}
	for _, f := range l.Calls[0].Fields {
		values[f.Path], hidden[f.Path] = f.Value, f.Hidden
	}
	if values["memo"] != `"\"><img src=x onerror=alert(1)>"` || values["note"] != `"<script>alert(1)</script>"` ||
		values["to"] != `"acct_9\u202e1"` || !hidden["to"] || hidden["memo"] {
		t.Fatalf("values: %q hidden %v", values, hidden)
	}
	for _, path := range []string{"/", "/app.js", "/api/pending"} {
		h := br.do(http.MethodGet, path, nil).header
		csp := h.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") || !strings.Contains(csp, "frame-ancestors 'none'") ||
			h.Get("X-Frame-Options") != "DENY" || h.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("%s headers: %v", path, h)
		}
	}
	page, _ := os.ReadFile("assets/index.html")
	if m := regexp.MustCompile(`<script(?:\s[^>]*)?>`).FindAllString(string(page), -1); len(m) != 1 || !strings.Contains(m[0], `src="app.js"`) {
		t.Fatalf("the page's scripts: %q", m)
	}
	if regexp.MustCompile(`\son[a-z]+=`).Match(page) {
		t.Fatal("the page has an inline event handler")
	}
	script, _ := os.ReadFile("assets/app.js")
	if m := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function`).Find(script); m != nil {
		t.Fatalf("app.js writes HTML or code: %s", m)
	}
	if res := br.do(http.MethodGet, "/nope", nil); res.status != http.StatusNotFound {
		t.Fatalf("an unknown path: %d", res.status)
	}
}

// TestAnOperatorsInboxAnswersOnlyOnLocalhost: without approvers the inbox
// acts as its operator with no login, to requests sent to localhost only:
// a site whose name resolves to 127.0.0.1 (DNS rebinding) is refused.
func TestAnOperatorsInboxAnswersOnlyOnLocalhost(t *testing.T) {
	t.Parallel()
	op := inbox.Approver{Name: "ops-desk", Groups: []string{"finance"}}
	b := setup(t, inbox.Config{Operator: &op})
	call := b.awaiting(t, "finance", `{"amount_cents":90000}`)
	rebound := b.browser(t)
	rebound.host = "evil.example"
	rebound.header = http.Header{"Origin": {"http://evil.example"}}
	for _, path := range []string{"/", "/api/session"} {
		if res := rebound.do(http.MethodGet, path, nil); res.status != http.StatusMisdirectedRequest {
			t.Fatalf("%s by another name: %d %s", path, res.status, res.body)
		}
	}
	br := b.browser(t)
	res := br.do(http.MethodGet, "/api/session", nil)
	var me struct {
		Name     string
		CSRF     string
		Operator bool
	}
	res.decode(t, &me)
	if res.status != http.StatusOK || me.Name != "ops-desk" || !me.Operator || me.CSRF == "" {
		t.Fatalf("the operator's session: %d %s", res.status, res.body)
	}
	if res := br.do(http.MethodPost, "/api/login", map[string]string{"token": "whatever-token-1234567890"}); res.status != http.StatusBadRequest {
		t.Fatalf("a login on an operator's inbox: %d", res.status)
	}
	br.csrf = me.CSRF
	if res := br.do(http.MethodPost, "/api/decide", decide(call.Key, "deny", "checked", call.ArgsDigest)); res.status != http.StatusOK {
		t.Fatalf("the operator's decision: %d %s", res.status, res.body)
	}
	if row, _ := b.store.Get(context.Background(), call.Key); row.LastDecision() == nil || row.LastDecision().By != "ops-desk" {
		t.Fatalf("decided by %+v", row.LastDecision())
	}
}

// TestTheEventStreamSaysWhatChanged: an open page is told of the approval
// events of its groups on the approvals stream at once, not of another
// group's, and of a decision the ledger alone recorded (a CLI without
// NATS) at the next poll.
func TestTheEventStreamSaysWhatChanged(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	nc := n.Connect()
	b := setup(t, inbox.Config{Conn: nc, Poll: 200 * time.Millisecond})
	br := b.browser(t)
	br.login(aliceToken)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.srv.URL+"/api/events", nil)
	res, err := br.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %v", res.StatusCode, res.Header)
	}
	events := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events <- data
			}
		}
		close(events)
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("the stream ended waiting for %s", what)
			}
			return e
		case <-ctx.Done():
			t.Fatalf("no event for %s", what)
		}
		return ""
	}
	publish := func(ev jobs.ApprovalEvent) {
		body, _ := json.Marshal(ev)
		if err := nc.Publish(jobs.ApprovalSubject(ev.ConversationID), body); err != nil {
			t.Fatal(err)
		}
	}
	opsKey, financeKey := strings.Repeat("b", 32), strings.Repeat("c", 32)
	publish(jobs.ApprovalEvent{Event: jobs.ApprovalRequested, Key: opsKey, ConversationID: "conv-x", Group: "ops"})
	publish(jobs.ApprovalEvent{Event: jobs.ApprovalApproved, Key: financeKey, ConversationID: "conv-x", Group: "finance"})
	if e := next("the finance event"); e != `{"event":"approved","key":"`+financeKey+`"}` {
		t.Fatalf("alice was told %s, want the finance event alone", e)
	}
	// Recorded in the ledger alone, as by a CLI that cannot reach NATS.
	call := b.awaiting(t, "finance", `{"amount_cents":90000}`)
	if e := next("the new call"); e != `{"event":"changed"}` {
		t.Fatalf("a call awaiting: %s", e)
	}
	if _, err := b.appr.Decide(ctx, call.Key, ledger.Decision{By: "cli", Reason: "no", Digest: call.ArgsDigest}); err != nil {
		t.Fatal(err)
	}
	if e := next("the decision"); e != `{"event":"changed"}` {
		t.Fatalf("a decision: %s", e)
	}
	// Close ends the stream.
	b.inbox.Close()
	for range events {
	}
}

// TestArgsThatDoNotHashToTheirDigestCannotBeApproved: the page shows the
// canonical args whose digest the decision names; a call whose args do not
// hash to its digest is shown as such, and can be denied, not approved.
func TestArgsThatDoNotHashToTheirDigestCannotBeApproved(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	call := b.awaitingDigest(t, "finance", `{"amount_cents":90000}`, strings.Repeat("d", 64), time.Hour)
	br := b.browser(t)
	br.login(aliceToken)
	if l := br.list("/api/pending"); len(l.Calls) != 1 || l.Calls[0].Verified {
		t.Fatalf("listed: %+v", l.Calls)
	}
	res := br.do(http.MethodPost, "/api/decide", decide(call.Key, "approve", "ok", call.ArgsDigest))
	if res.status != http.StatusConflict || res.code() != "unverified" {
		t.Fatalf("approve: %d %s", res.status, res.body)
	}
	if res := br.do(http.MethodPost, "/api/decide", decide(call.Key, "deny", "cannot check it", call.ArgsDigest)); res.status != http.StatusOK {
		t.Fatalf("deny: %d %s", res.status, res.body)
	}
}

// TestClosingTheInboxEndsItsStreamsAndGoroutines: Close ends the pages'
// open event streams (a server's shutdown does not wait for them) and the
// inbox's polling. Not parallel: goleak counts every goroutine of the
// process.
func TestClosingTheInboxEndsItsStreamsAndGoroutines(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // runs last, after the ledger and NATS stopped
	n := testenv.StartNATS(t)
	nc := n.Connect()
	b := setup(t, inbox.Config{Conn: nc, Poll: 10 * time.Millisecond})
	br := b.browser(t)
	br.login(aliceToken)
	res, err := br.client.Get(b.srv.URL + "/api/events")
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { io.Copy(io.Discard, res.Body); close(ended) }()
	b.inbox.Close()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the event stream is still open after Close")
	}
	res.Body.Close()
	br.client.CloseIdleConnections()
	nc.Close()
}
