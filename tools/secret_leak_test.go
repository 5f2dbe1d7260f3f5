package tools_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/toolq/toolq/tools"
)

// A downstream that echoes the request (as httpbin's /anything, or an API
// answering "created webhook with secret …") answers 200 with the header's
// token in its body: the output becomes the result, the ledger row's and the
// results stream's, which docs/configuration.md says a secret is never in.
func TestSecretEchoedInASuccessfulAnswerIsNotInTheResult(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"headers": map[string]string{"Authorization": r.Header.Get("Authorization")}})
	}))
	defer srv.Close()
	reg, err := secretRegistry(t, `      url: ${BASE}/anything
      headers: {Authorization: "Bearer ${PAY_TOKEN}"}
`, map[string]string{"BASE": srv.URL, "PAY_TOKEN": "tok-success-5ecret"})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	out, err := tool.Run(context.Background(), tools.Request{Tool: "pay", Key: "k1", Args: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "tok-success-5ecret") {
		t.Errorf("the result %s shows the secret", out)
	}
}

// A URL variable with credentials in its userinfo (ELASTIC_URL=
// https://user:password@host:9200): the secret kept is "user:password@",
// which no message ever holds; the password alone, or the Basic header
// net/http makes of it, echoed in a 401, is shown.
func TestPasswordInAURLVariablesUserinfoIsRedacted(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, _ := r.BasicAuth()
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"error":"bad password ` + pass + ` for ` + user + `","authorization":"` + r.Header.Get("Authorization") + `"}`))
	}))
	defer srv.Close()
	withCreds := strings.Replace(srv.URL, "http://", "http://svc:pw-userinfo-5ecret@", 1)
	reg, err := secretRegistry(t, `      url: ${API_URL}/v1/pay
`, map[string]string{"API_URL": withCreds})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	_, err = tool.Run(context.Background(), tools.Request{Tool: "pay", Key: "k1", Args: json.RawMessage(`{}`)})
	var te *tools.Error
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a tool error", err)
	}
	basic := base64.StdEncoding.EncodeToString([]byte("svc:pw-userinfo-5ecret"))
	for _, form := range []string{"pw-userinfo-5ecret", basic} {
		if strings.Contains(te.Message, form) {
			t.Errorf("the message %q shows the secret (as %q)", te.Message, form)
		}
	}
}

// An error body is cut at 512 bytes: a secret straddling the cut is not
// found whole, and its first bytes are shown.
func TestSecretCutByTheErrorsSnippetIsNotShownInPart(t *testing.T) {
	t.Parallel()
	const secret = "tok-0123456789abcdef-5ecret"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(strings.Repeat(".", 490) + "rejected token " + r.Header.Get("X-Api-Key")))
	}))
	defer srv.Close()
	reg, err := secretRegistry(t, `      url: ${BASE}/v1/pay
      headers: {X-Api-Key: "${API_KEY}"}
`, map[string]string{"BASE": srv.URL, "API_KEY": secret})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	_, err = tool.Run(context.Background(), tools.Request{Tool: "pay", Key: "k1", Args: json.RawMessage(`{}`)})
	var te *tools.Error
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a tool error", err)
	}
	if strings.Contains(te.Message, secret[:6]) {
		t.Errorf("the message ends %q: the secret's first bytes", te.Message[len(te.Message)-40:])
	}
}

// Two references whose values overlap (an account id in the path, a token
// that begins with it in a header): the shorter, kept first, is replaced
// first, and the rest of the token is shown.
func TestSecretContainingAnotherIsRedactedWhole(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"error":"invalid token ` + strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ") + `"}`))
	}))
	defer srv.Close()
	reg, err := secretRegistry(t, `      url: ${BASE}/accounts/${ACCOUNT}/pay
      headers: {Authorization: "Bearer ${TOKEN}"}
`, map[string]string{"BASE": srv.URL, "ACCOUNT": "acct_12345", "TOKEN": "acct_12345.sk_live_9f8e7d6c5b"})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	_, err = tool.Run(context.Background(), tools.Request{Tool: "pay", Key: "k1", Args: json.RawMessage(`{}`)})
	var te *tools.Error
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a tool error", err)
	}
	if strings.Contains(te.Message, "sk_live_9f8e7d6c5b") {
		t.Errorf("the message %q shows the token's secret part", te.Message)
	}
}

// A token with characters a path must escape, written escaped in the
// variable as a URL needs it (k3y%2Fs3cret): an mcp tool's Downstream (the
// span and metric attribute toolq.downstream, the breaker's log) is built
// from the decoded path, which no form of the secret kept matches.
func TestEscapedSecretInAnMCPURLIsRedactedFromItsDownstream(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + l.Addr().String()
	l.Close()
	reg, err := tools.Parse([]byte(`tools:
  - name: search
    class: read
    timeout: 2s
    schema: {type: object}
    mcp:
      url: ${BASE}/mcp/${MCP_KEY}
`), "secrets.yaml", tools.Config{Getenv: func(k string) string {
		return map[string]string{"BASE": base, "MCP_KEY": "k3y%2Fmcp-5ecret%2Bx"}[k]
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	tool, _ := reg.Lookup("search")
	if strings.Contains(tool.Downstream, "mcp-5ecret") {
		t.Errorf("downstream %q shows the secret", tool.Downstream)
	}
}

// A downstream whose JSON encoder escapes "/" (PHP's json_encode, many
// others) echoes a base64 token in a 401: the message holds it as
// "ab\/cd…", a form the redaction does not look for.
func TestSecretEchoedJSONEscapedInAnErrorIsRedacted(t *testing.T) {
	t.Parallel()
	const secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY+5ecret=="
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"error":"invalid key","key":"` + strings.ReplaceAll(r.Header.Get("X-Api-Key"), "/", `\/`) + `"}`))
	}))
	defer srv.Close()
	reg, err := secretRegistry(t, `      url: ${BASE}/v1/pay
      headers: {X-Api-Key: "${API_KEY}"}
`, map[string]string{"BASE": srv.URL, "API_KEY": secret})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	_, err = tool.Run(context.Background(), tools.Request{Tool: "pay", Key: "k1", Args: json.RawMessage(`{}`)})
	var te *tools.Error
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a tool error", err)
	}
	if strings.Contains(te.Message, "bPxRfiCY+5ecret==") {
		t.Errorf("the message %q shows the secret", te.Message)
	}
}
