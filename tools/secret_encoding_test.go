package tools_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf16"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolq/toolq/tools"
)

// jsonString is v JSON-encoded, without its quotes, as Go writes it
// (HTML-escaped: "<" as \u003c).
func jsonString(v string) string {
	b, _ := json.Marshal(v)
	return string(b[1 : len(b)-1])
}

// asciiOnly is s with what is not ASCII escaped as \uXXXX (UTF-16), in
// lower-case hex as Python's json.dumps writes it, or upper-case (with the
// escapes s had upper-cased too), as Jackson does.
func asciiOnly(s string, upper bool) string {
	format := `\u%04x`
	if upper {
		format = `\u%04X`
		s = strings.NewReplacer(`\u003c`, `\u003C`, `\u003e`, `\u003E`).Replace(s)
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r < 0x80:
			b.WriteRune(r)
		case r > 0xFFFF:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, format+format, r1, r2)
		default:
			fmt.Fprintf(&b, format, r)
		}
	}
	return b.String()
}

// jsonPlain is v JSON-encoded, without its quotes, with no HTML escapes.
func jsonPlain(v string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	s := strings.TrimSpace(b.String())
	return s[1 : len(s)-1]
}

// The encodings in which a downstream may echo a secret it was sent; none
// may leave a part of it in a result or an error.
var secretEncodings = []struct {
	name   string
	value  string // the variable's value
	encode func(string) string
}{
	{"raw", "k3y-5ecret.with_no_escapes", func(v string) string { return v }},
	{"path escaped", "k3y/5ecret+<a&b> ü==", url.PathEscape},
	{"query escaped", "k3y/5ecret+<a&b> ü==", url.QueryEscape},
	{"query escaped with %20", "k3y/5ecret+<a&b> ü==", func(v string) string { return strings.ReplaceAll(url.QueryEscape(v), "+", "%20") }},
	{"path unescaped (the variable holds it escaped)", "k3y%2F5ecret%2Bx", func(v string) string { u, _ := url.PathUnescape(v); return u }},
	{"query unescaped (the variable holds it escaped)", "k3y%2F5ecret%3Dx", func(v string) string { u, _ := url.QueryUnescape(v); return u }},
	{"JSON escaped", "k3y/5ecret+<a&b> ü==", jsonString},
	{"JSON escaped without HTML escapes", "k3y/5ecret+<a&b> ü==", jsonPlain},
	{`JSON escaped with \/`, "k3y/5ecret+<a&b> ü==", func(v string) string { return strings.ReplaceAll(jsonString(v), "/", `\/`) }},
	{`JSON escaped with \u003C`, "k3y/5ecret+<a&b> ü==", func(v string) string {
		return strings.NewReplacer(`\u003c`, `\u003C`, `\u003e`, `\u003E`).Replace(jsonString(v))
	}},
	{"JSON escaped ASCII only (Python)", "k3y/5ecret+<a&b> ü==", func(v string) string { return asciiOnly(jsonPlain(v), false) }},
	{"JSON escaped ASCII only, upper-case hex, with \\/", "k3y/5ecret+<a&b> ü==", func(v string) string {
		return asciiOnly(strings.ReplaceAll(jsonString(v), "/", `\/`), true)
	}},
	{"JSON escaped ASCII only, beyond the BMP", "k3y-5ecret-\U0001F511", func(v string) string { return asciiOnly(jsonString(v), false) }},
}

// A downstream echoes the key it was sent, in each encoding, in a
// successful answer (the result) and in a refusal (the error): neither
// holds any part of it, and the result is still JSON.
func TestSecretIsRedactedInEveryEncodingADownstreamEchoes(t *testing.T) {
	t.Parallel()
	for _, enc := range secretEncodings {
		for _, status := range []int{http.StatusOK, http.StatusUnauthorized} {
			t.Run(fmt.Sprintf("%s %d", enc.name, status), func(t *testing.T) {
				t.Parallel()
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.WriteHeader(status)
					fmt.Fprintf(w, `{"error":"the key %s is not ours","key":"%s"}`, enc.encode(r.Header.Get("X-Api-Key")), enc.encode(r.Header.Get("X-Api-Key")))
				}))
				defer srv.Close()
				reg, err := secretRegistry(t, `      url: ${BASE}/v1/pay
      headers: {X-Api-Key: "${API_KEY}"}
`, map[string]string{"BASE": srv.URL, "API_KEY": enc.value})
				if err != nil {
					t.Fatal(err)
				}
				tool, _ := reg.Lookup("pay")
				out, err := tool.Run(context.Background(), tools.Request{Tool: "pay", Key: "k1", Args: json.RawMessage(`{}`)})
				shown := string(out)
				if status == http.StatusOK {
					if err != nil {
						t.Fatal(err)
					}
					if !json.Valid(out) {
						t.Errorf("the result %s is not JSON", out)
					}
				} else {
					var te *tools.Error
					if !errors.As(err, &te) {
						t.Fatalf("err = %v, want a tool error", err)
					}
					shown = te.Message
				}
				if strings.Contains(shown, "k3y") || strings.Contains(shown, "5ecret") {
					t.Errorf("%q shows the secret", shown)
				}
				if !strings.Contains(shown, tools.Redacted) {
					t.Errorf("%q does not say where the secret was", shown)
				}
			})
		}
	}
}

// A URL variable's userinfo (https://user:password@host): its user, its
// password, both as the URL writes them and as the Basic Authorization
// net/http makes of them, are secrets.
func TestUserinfoOfAURLVariableIsRedactedInEveryForm(t *testing.T) {
	t.Parallel()
	const user, pass = "svc-5ecret-user", "pw/5ecret+pass"
	basic := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	for _, status := range []int{http.StatusOK, http.StatusUnauthorized} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				u, p, _ := r.BasicAuth()
				w.WriteHeader(status)
				json.NewEncoder(w).Encode(map[string]string{"user": u, "password": p, "authorization": r.Header.Get("Authorization"),
					"userinfo": url.UserPassword(u, p).String(), "pair": u + ":" + p})
			}))
			defer srv.Close()
			withCreds := strings.Replace(srv.URL, "http://", "http://"+url.UserPassword(user, pass).String()+"@", 1)
			reg, err := secretRegistry(t, `      url: ${API_URL}/v1/pay
`, map[string]string{"API_URL": withCreds})
			if err != nil {
				t.Fatal(err)
			}
			tool, _ := reg.Lookup("pay")
			out, err := tool.Run(context.Background(), tools.Request{Tool: "pay", Key: "k1", Args: json.RawMessage(`{}`)})
			shown := string(out)
			if te := (*tools.Error)(nil); errors.As(err, &te) {
				shown = te.Message
			} else if err != nil {
				t.Fatal(err)
			}
			for _, form := range []string{"5ecret", basic} {
				if strings.Contains(shown, form) {
					t.Errorf("%q shows the secret (as %q)", shown, form)
				}
			}
		})
	}
}

// Two secrets that overlap (the end of one is the start of the other):
// where a downstream writes them run together, no byte of either is left.
func TestOverlappingSecretsAreRedactedWhole(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, `{"error":"bad %s"}`, strings.TrimSuffix(r.Header.Get("X-A"), "OVERLAP")+r.Header.Get("X-B"))
	}))
	defer srv.Close()
	reg, err := secretRegistry(t, `      url: ${BASE}/v1/pay
      headers: {X-A: "${A}", X-B: "${B}"}
`, map[string]string{"BASE": srv.URL, "A": "first-5ecret-OVERLAP", "B": "OVERLAP-second-5ecret"})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	_, err = tool.Run(context.Background(), tools.Request{Tool: "pay", Key: "k1", Args: json.RawMessage(`{}`)})
	var te *tools.Error
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a tool error", err)
	}
	if want := `{"error":"bad ` + tools.Redacted + `"}`; te.Message != want {
		t.Errorf("message %q, want %q", te.Message, want)
	}
}

// An error quotes the first 512 bytes of an answer: wherever the cut falls
// in a secret (before it, in it, after it), no part of it is shown.
func TestSecretCutAnywhereByTheErrorsSnippetIsNotShown(t *testing.T) {
	t.Parallel()
	const secret = "k3y-0123456789-5ecret"
	for cut := -2; cut <= len(secret)+2; cut++ {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprint(w, strings.Repeat(".", 512-cut)+r.Header.Get("X-Api-Key")+strings.Repeat(".", 20))
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
			shown := strings.TrimSuffix(te.Message, "…")
			if strings.Contains(shown, "k") || strings.Contains(shown, "5ecret") {
				t.Errorf("the message ends %q", shown[max(0, len(shown)-30):])
			}
			if len(shown) > 512 {
				t.Errorf("the message is %d bytes long, past the snippet's 512", len(shown))
			}
		})
	}
}

// An MCP server that echoes the token it was sent, in its result's text
// and its structured content, or in a tool error: the result and the error
// hold none of it, and the result is still JSON.
func TestSecretEchoedByAnMCPServerIsNotInTheResult(t *testing.T) {
	t.Parallel()
	const token = "mcp/5ecret+<token>"
	var auth atomic.Value
	srv := mcp.NewServer(&mcp.Implementation{Name: "echo", Version: "1"}, nil)
	echo := func(isError, structured bool) mcp.ToolHandler {
		return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			a, _ := auth.Load().(string)
			res := &mcp.CallToolResult{IsError: isError, Content: []mcp.Content{&mcp.TextContent{Text: "called with " + a}}}
			if structured {
				res.StructuredContent = map[string]any{"authorization": a, "escaped": strings.ReplaceAll(a, "/", `\/`)}
			}
			return res, nil
		}
	}
	schema := json.RawMessage(`{"type":"object"}`)
	srv.AddTool(&mcp.Tool{Name: "text", InputSchema: schema}, echo(false, false))
	srv.AddTool(&mcp.Tool{Name: "structured", InputSchema: schema}, echo(false, true))
	srv.AddTool(&mcp.Tool{Name: "refused", InputSchema: schema}, echo(true, false))
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		handler.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	for _, name := range []string{"text", "structured", "refused"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			reg, err := tools.Parse([]byte(`tools:
  - name: `+name+`
    class: read
    timeout: 5s
    schema: {type: object}
    mcp:
      url: ${BASE}/mcp
      headers: {Authorization: "Bearer ${MCP_TOKEN}"}
`), "secrets.yaml", tools.Config{Getenv: func(k string) string {
				return map[string]string{"BASE": ts.URL, "MCP_TOKEN": token}[k]
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close()
			tool, _ := reg.Lookup(name)
			out, err := tool.Run(context.Background(), tools.Request{Tool: name, Args: json.RawMessage(`{}`)})
			shown := string(out)
			if name == "refused" {
				var te *tools.Error
				if !errors.As(err, &te) {
					t.Fatalf("err = %v, want a tool error", err)
				}
				shown = te.Message
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if !json.Valid(out) {
					t.Errorf("the result %s is not JSON", out)
				}
			}
			if strings.Contains(shown, "5ecret") {
				t.Errorf("%q shows the secret", shown)
			}
			if !strings.Contains(shown, tools.Redacted) {
				t.Errorf("%q does not say where the secret was", shown)
			}
		})
	}
}
