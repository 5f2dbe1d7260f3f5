// Package approvals_test tests the approvals inbox in a real browser: a
// consumer built from cmd/consumer serves it (--approvals-listen), and
// inbox.mjs drives headless Chromium through it with playwright-core
// (make test-approvals-deps installs it; Debian's chromium package is the
// browser).
package approvals_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// aliceToken is the inbox's approver alice's token (from her variable).
const aliceToken = "alice-0f1e2d3c4b5a69788796a5b4c3d2e1f0"

// tools is the registry: send_payment pays through payments, and waits for
// a finance approver above 500.00.
const tools = `tools:
  - name: send_payment
    class: keyed_write
    timeout: 10s
    schema:
      type: object
      additionalProperties: false
      required: [invoice_id, amount_cents]
      properties:
        invoice_id: {type: string}
        amount_cents: {type: integer}
        memo: {type: string}
        note: {type: string}
    approval: {when: args.amount_cents > 50000, ttl: 1h, group: finance}
    http: {method: POST, url: %s/v1/payments}
`

// approvers: alice approves for finance, oscar for ops.
const approvers = `approvers:
  - name: alice
    groups: [finance]
    token_env: TOOLQ_TEST_ALICE_TOKEN
  - name: oscar
    groups: [ops]
    token_sha256: 0000000000000000000000000000000000000000000000000000000000000000
`

// payments is the payment API: it counts every payment it makes, by
// invoice.
type payments struct {
	mu   sync.Mutex
	paid map[string]int
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		InvoiceID string `json:"invoice_id"`
	}
	if r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&body) != nil {
		http.Error(w, "want a POSTed payment", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.paid[body.InvoiceID]++
	n := p.paid[body.InvoiceID]
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"paid":true,"invoice_id":%q,"payment":%d}`, body.InvoiceID, n)
}

func (p *payments) count() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.paid {
		out[k] = v
	}
	return out
}

// TestABrowserApprovesOneCallAndDeniesAnotherAndOnlyTheApprovedOnePays:
// alice logs in to the inbox in Chromium, sees call a with its exact
// canonical args and digest, sees b (args that are markup) and c arrive
// live, and c decided over NATS meanwhile; she approves a and denies b,
// each with a reason. Exactly one payment is made, for a; both tool_use_ids
// of a get its ok result, both of b the denial, and neither b nor c ever
// reaches the payment API.
func TestABrowserApprovesOneCallAndDeniesAnotherAndOnlyTheApprovedOnePays(t *testing.T) {
	t.Parallel()
	chromium := browser(t)
	script := nodeScript(t, "inbox.mjs")
	consumer := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	pay := &payments{paid: map[string]int{}}
	api := httptest.NewServer(pay)
	t.Cleanup(api.Close)
	n := testenv.StartNATS(t)
	dir := t.TempDir()
	toolsFile, approversFile := filepath.Join(dir, "tools.yaml"), filepath.Join(dir, "approvers.yaml")
	os.WriteFile(toolsFile, fmt.Appendf(nil, tools, api.URL), 0o600)
	os.WriteFile(approversFile, []byte(approvers), 0o600)
	inboxURL := startConsumer(t, ctx, consumer, "--nats-url", n.URL, "--data-dir", filepath.Join(dir, "data"), "--tools", toolsFile,
		"--approvals-listen", "127.0.0.1:0", "--approvals-tokens", approversFile)

	nc := n.Connect()
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	client := jobs.NewClient(js)
	const conv = "conv-inbox-browser"
	call := func(turn int64, args string) jobs.Job {
		return jobs.Job{ConversationID: conv, TurnIndex: turn, Tool: "send_payment", Args: json.RawMessage(args)}
	}
	// A call is sent once per tool_use_id, as retried turns would, and
	// answered awaiting approval each time.
	publish := func(j jobs.Job, ids ...string) {
		t.Helper()
		for _, id := range ids {
			j.ToolUseID = id
			if _, err := client.Publish(ctx, &j); err != nil {
				t.Fatal(err)
			}
			if r, err := client.Await(ctx, conv, id); err != nil || r.Status != jobs.StatusAwaitingApproval {
				t.Fatalf("%s: %+v %v", id, r, err)
			}
		}
	}
	memo, note := `"><img src=x onerror="window.__pwned=1">`, `<script>window.__pwned=1</script>`
	a := call(1, `{"invoice_id":"inv_a","amount_cents":90000}`)
	b := call(2, fmt.Sprintf(`{"note":%q,"invoice_id":"inv_b","amount_cents":75000,"memo":%q}`, note, memo))
	c := call(3, `{"invoice_id":"inv_c","amount_cents":60000}`)
	keyA, digestA := keyOf(t, a)
	keyB, _ := keyOf(t, b)
	keyC, digestC := keyOf(t, c)
	publish(a, "toolu_a1", "toolu_a2")

	cfg, _ := json.Marshal(map[string]any{"chromium": chromium, "url": inboxURL, "token": aliceToken,
		"a": map[string]string{"key": keyA, "args": `{"amount_cents":90000,"invoice_id":"inv_a"}`, "digest": digestA},
		"b": map[string]string{"key": keyB, "memo": memo, "note": note},
		"c": map[string]string{"key": keyC}})
	cmd := exec.CommandContext(ctx, "node", script, string(cfg))
	var stderr testenv.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	steps := bufio.NewScanner(stdout)
	step := func(want string) json.RawMessage {
		t.Helper()
		if !steps.Scan() {
			cmd.Wait()
			t.Fatalf("the browser stopped before %q: %s", want, stderr.String())
		}
		var s struct{ Step string }
		if json.Unmarshal(steps.Bytes(), &s) != nil || s.Step != want {
			t.Fatalf("the browser said %s, want step %q", steps.Bytes(), want)
		}
		return json.RawMessage(slices.Clone(steps.Bytes()))
	}
	step("listed")
	// While the page is open: b arrives, c arrives and is denied over NATS.
	publish(b, "toolu_b1", "toolu_b2")
	publish(c, "toolu_c1")
	req, _ := json.Marshal(jobs.DecisionRequest{Key: keyC, Decision: "deny", By: "nats-approver", Reason: "duplicate of inv_a", Digest: digestC})
	msg, err := nc.RequestWithContext(ctx, jobs.DecideSubject("finance"), req)
	if err != nil || !strings.Contains(string(msg.Data), `"status":"denied"`) {
		t.Fatalf("deny c over NATS: %v %s", err, msgData(msg))
	}
	done := step("done")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var seen struct {
		History map[string]struct{ Decision, By, Reason, State string }
	}
	json.Unmarshal(done, &seen)
	for name, want := range map[string]struct{ Decision, By, Reason, State string }{
		"a": {"approved", "alice", "invoice A matches its purchase order", "completed"},
		"b": {"denied", "alice", "the memo is not an invoice", "failed"},
		"c": {"denied", "nats-approver", "duplicate of inv_a", "failed"},
	} {
		if seen.History[name] != want {
			t.Errorf("the history's %s: %+v, want %+v", name, seen.History[name], want)
		}
	}

	// Every tool_use_id that asked has its final result.
	for id, want := range map[string]jobs.Status{"toolu_a1": jobs.StatusOK, "toolu_a2": jobs.StatusOK,
		"toolu_b1": jobs.StatusDenied, "toolu_b2": jobs.StatusDenied, "toolu_c1": jobs.StatusDenied} {
		r, err := client.Await(ctx, conv, id, jobs.UntilFinal())
		if err != nil || r.Status != want || r.Approval == nil {
			t.Fatalf("the final result of %s: %+v %v, want %s", id, r, err, want)
		}
		if want == jobs.StatusOK && !strings.Contains(string(r.Output), `"invoice_id":"inv_a"`) {
			t.Fatalf("%s: output %s", id, r.Output)
		}
		if id == "toolu_b1" && (r.Approval.DecidedBy != "alice" || r.Approval.Reason != "the memo is not an invoice") {
			t.Fatalf("%s: %+v", id, r.Approval)
		}
	}
	if paid := pay.count(); len(paid) != 1 || paid["inv_a"] != 1 {
		t.Fatalf("payments %v: want exactly one, for inv_a", paid)
	}
}

// keyOf is the key and the args digest of a call.
func keyOf(t *testing.T, j jobs.Job) (string, string) {
	t.Helper()
	m, err := jobs.Call{ConversationID: j.ConversationID, TurnIndex: j.TurnIndex, Tool: j.Tool, Ordinal: j.Ordinal, Args: j.Args}.Material()
	if err != nil {
		t.Fatal(err)
	}
	return m.Key(), m.ArgsDigest()
}

func msgData(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}

// startConsumer runs the built consumer with args until the test ends,
// and returns the inbox's URL from its banner.
func startConsumer(t *testing.T, ctx context.Context, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true", "TOOLQ_TEST_ALICE_TOKEN="+aliceToken)
	var out, logs testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("consumer output:\n%s\n%s", out.String(), logs.String())
		}
		if strings.Contains(logs.String(), aliceToken) || strings.Contains(out.String(), aliceToken) {
			t.Error("the consumer logged alice's token")
		}
	})
	banner := regexp.MustCompile(`inbox\s+(http://\S+/)`)
	var url string
	testenv.Eventually(t, 60*time.Second, "the consumer's banner with the inbox", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("the consumer exited: %v\n%s\n%s", err, out.String(), logs.String())
		default:
		}
		if m := banner.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
		}
		return url != "" && ctx.Err() == nil
	})
	return url
}

// browser is the path of Chromium, or a loud skip (a failure in CI) when
// there is none: TOOLQ_CHROMIUM, else chromium on the PATH (Debian's
// chromium package).
func browser(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TOOLQ_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Missing(t, "no Chromium: the inbox's browser test needs it (apt-get install chromium, or TOOLQ_CHROMIUM=PATH)")
	return ""
}

// nodeScript is the path of a script of this folder, run with node, or a
// loud skip (a failure in CI) when node or playwright-core is missing.
func nodeScript(t *testing.T, name string) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		testenv.Missing(t, "node is not installed: the inbox's browser test needs it")
	}
	if _, err := os.Stat("node_modules/playwright-core/package.json"); err != nil {
		testenv.Missing(t, "test/approvals's npm packages are not installed (make test-approvals-deps): %v", err)
	}
	script, err := filepath.Abs(name)
	if err != nil {
		t.Fatal(err)
	}
	return script
}

// build builds the consumer for the test.
func build(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/", "github.com/toolq/toolq/cmd/consumer").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "consumer")
}
