package tools_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/toolq/toolq/tools"
)

// FuzzArgsNeverReplaceTheKeyInTheBody: whatever member the args carry, a
// downstream that reads the key with Go's encoding/json (which matches names
// ignoring case, Unicode folding included, and lets the last one win) reads
// toolq's key, or the call is refused before it is sent.
func FuzzArgsNeverReplaceTheKeyInTheBody(f *testing.F) {
	for _, name := range []string{"idempotency_key", "IDEMPOTENCY_KEY", "Idempotency_Key", "idempotency_\u212aey", "idempotencyKey",
		"idempotency-key", "idempotency_key[]", "idempotency_kEy", "İdempotency_key", "idempotency_keys", "a"} {
		f.Add(name, "victim")
	}
	var seen string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var v struct {
			IdempotencyKey string `json:"idempotency_key"`
		}
		json.Unmarshal(body, &v)
		seen = v.IdempotencyKey
		w.Write([]byte(`{}`))
	}))
	f.Cleanup(srv.Close)
	reg, err := tools.Parse([]byte("tools:\n  - name: t\n    class: keyed_write\n    schema: {type: object}\n    concurrency: 1\n    http: {method: POST, url: \""+srv.URL+"\", idempotency_body_field: idempotency_key}\n"), "reg.yaml", tools.Config{})
	if err != nil {
		f.Fatal(err)
	}
	tool, _ := reg.Lookup("t")
	f.Fuzz(func(t *testing.T, name, value string) {
		args, err := json.Marshal(map[string]string{name: value})
		if err != nil {
			return
		}
		if tool.Validate(args) != nil {
			return // refused before anything is claimed or sent
		}
		seen = ""
		if _, outcome, te := call(t, tool, string(args)); outcome != tools.Success {
			t.Fatalf("args %s: %s %v", args, outcome, te)
		}
		if seen != "k123" {
			t.Fatalf("args %s: the downstream read the key %q, not toolq's", args, seen)
		}
	})
}
