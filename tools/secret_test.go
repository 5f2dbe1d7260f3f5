package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolq/toolq/tools"
)

// secretRegistry parses one http tool, its YAML given, with env as the
// environment.
func secretRegistry(t *testing.T, httpYAML string, env map[string]string) (*tools.Registry, error) {
	t.Helper()
	reg, err := tools.Parse([]byte(`tools:
  - name: pay
    class: keyed_write
    timeout: 2s
    schema: {type: object}
    http:
`+httpYAML), "secrets.yaml", tools.Config{Getenv: func(k string) string { return env[k] }})
	if err == nil {
		t.Cleanup(func() { reg.Close() })
	}
	return reg, err
}

// secretFile writes content to a new file and returns its path.
func secretFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFileReferenceSendsTheFilesContentWithoutItsNewline(t *testing.T) {
	t.Parallel()
	var auth, path atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		path.Store(r.URL.Path)
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	file := secretFile(t, "tok-from-file\n")
	reg, err := secretRegistry(t, `      url: ${BASE}/hooks/${API_KEY}/pay
      headers: {Authorization: "Bearer ${file:`+file+`}", X-Region: "${REGION:-eu}"}
`, map[string]string{"BASE": srv.URL, "API_KEY": "key-from-env"})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("pay")
	if _, err := tool.Run(context.Background(), tools.Request{Tool: "pay", Key: "k1", Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if got := auth.Load(); got != "Bearer tok-from-file" {
		t.Errorf("Authorization = %q, want the file's content without its newline", got)
	}
	if got := path.Load(); got != "/hooks/key-from-env/pay" {
		t.Errorf("path = %q", got)
	}
}

func TestReferenceThatCannotBeResolvedNamesItsSourceNotAValue(t *testing.T) {
	t.Parallel()
	empty := secretFile(t, "\n")
	missing := filepath.Join(t.TempDir(), "absent")
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unreadable file", `      url: http://127.0.0.1:1/pay
      headers: {Authorization: "Bearer ${file:` + missing + `}"}
`, []string{missing, "http.headers.Authorization", "no such file"}},
		{"empty file", `      url: http://127.0.0.1:1/pay
      headers: {Authorization: "Bearer ${file:` + empty + `}"}
`, []string{empty, "empty"}},
		{"unset variable", `      url: http://127.0.0.1:1/${API_KEY}/pay
`, []string{"API_KEY", "http.url"}},
		// The registry refuses a query; its error quotes the URL, with the
		// secret in it redacted.
		{"secret in a refused URL", `      url: http://127.0.0.1:1/pay?key=${SECRET}
`, []string{"url", "no query", tools.Redacted}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := secretRegistry(t, tc.yaml, map[string]string{"SECRET": "hush-hush-value"})
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "hush-hush-value") {
				t.Errorf("error %q shows the secret", err)
			}
		})
	}
}

func TestSecretInTheURLIsRedactedFromErrorsAndSpans(t *testing.T) {
	t.Parallel()
	// A port nothing listens on: the call is refused, and net/http's error
	// quotes the URL.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + l.Addr().String()
	l.Close()
	reg, err := secretRegistry(t, `      url: ${BASE}/hooks/${API_KEY}/pay
      method: GET
`, map[string]string{"BASE": base, "API_KEY": "key/with+escapes"})
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, parent := tp.Tracer("test").Start(context.Background(), "tool pay")
	tool, _ := reg.Lookup("pay")
	_, err = tool.Run(ctx, tools.Request{Tool: "pay", Key: "k1", Args: json.RawMessage(`{"q":"x"}`)})
	parent.End()
	var te *tools.Error
	if !errors.As(err, &te) || te.Outcome != tools.NotSent {
		t.Fatalf("err = %v, want not sent", err)
	}
	secretForms := []string{"key/with+escapes", "key%2Fwith+escapes", "key%2Fwith%2Bescapes"}
	shown := []string{err.Error(), te.Message}
	if te.Err != nil {
		shown = append(shown, te.Err.Error())
	}
	var urlFull string
	for _, s := range rec.Ended() {
		shown = append(shown, s.Name(), s.Status().Description)
		for _, kv := range s.Attributes() {
			shown = append(shown, kv.Value.String())
			if s.SpanKind() == trace.SpanKindClient && kv.Key == "url.full" {
				urlFull = kv.Value.String()
			}
		}
		for _, ev := range s.Events() {
			for _, kv := range ev.Attributes {
				shown = append(shown, kv.Value.String())
			}
		}
	}
	for _, text := range shown {
		for _, f := range secretForms {
			if strings.Contains(text, f) {
				t.Errorf("%q shows the secret", text)
			}
		}
	}
	// The origin, from ${BASE}, is the downstream's name: shown.
	if want := base + "/hooks/" + tools.Redacted + "/pay?q=x"; urlFull != want {
		t.Errorf("url.full = %q, want %q", urlFull, want)
	}
	if !strings.Contains(te.Message, tools.Redacted) {
		t.Errorf("message %q does not say where the secret was", te.Message)
	}
}

func TestSecretInAnMCPServersURLIsRedactedFromItsErrorsAndName(t *testing.T) {
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
      headers: {Authorization: "Bearer ${MCP_KEY}"}
`), "secrets.yaml", tools.Config{Getenv: func(k string) string {
		return map[string]string{"BASE": base, "MCP_KEY": "mcp-key-5ecret"}[k]
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	tool, _ := reg.Lookup("search")
	_, err = tool.Run(context.Background(), tools.Request{Tool: "search", Args: json.RawMessage(`{}`)})
	if err == nil {
		t.Fatal("a server that is not there answered")
	}
	var te *tools.Error
	errors.As(err, &te)
	for _, text := range []string{err.Error(), te.Message, fmt.Sprint(te.Err), tool.Downstream} {
		if strings.Contains(text, "mcp-key-5ecret") {
			t.Errorf("%q shows the secret", text)
		}
	}
	if want := "mcp:" + base + "/mcp/" + tools.Redacted; tool.Downstream != want {
		t.Errorf("downstream %q, want %q", tool.Downstream, want)
	}
}
