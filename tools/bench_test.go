package tools_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/toolq/toolq/tools"
)

// BenchmarkHTTPCall is one call of an HTTP tool, with a body of the
// quickstart's size, to a downstream on this machine that reads it and
// answers: the executor's cost and the downstream's, per call.
func BenchmarkHTTPCall(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, `{"id":"pay_000001","status":"succeeded"}`)
	}))
	defer srv.Close()
	exec, err := tools.HTTPExecutor(tools.HTTP{Method: "POST", URL: srv.URL + "/v1/payments"})
	if err != nil {
		b.Fatal(err)
	}
	args := json.RawMessage(`{"invoice_id":"inv_1","amount_cents":500,"currency":"EUR"}`)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := exec.Execute(context.Background(), tools.Request{Tool: "send_payment", Key: "k", Args: args}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
