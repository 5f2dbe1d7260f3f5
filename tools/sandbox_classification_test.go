package tools_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/toolq/toolq/demo"
	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/tools"
)

// TestClassificationAgainstTheSandbox: the demo tools against the sandbox
// API, row by row of the classification.
func TestClassificationAgainstTheSandbox(t *testing.T) {
	t.Parallel()
	sb, _ := sandbox.New(sandbox.Config{})
	srv := httptest.NewServer(sb)
	defer srv.Close()
	reg, err := demo.Registry(srv.URL, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pay, _ := reg.Lookup("send_payment")
	ticket, _ := reg.Lookup("create_ticket")
	run := func(tool *tools.Tool, key, args string) (tools.Outcome, *tools.Error) {
		_, err := tool.Run(context.Background(), tools.Request{Key: key, Args: json.RawMessage(args)})
		return tools.Classify(err)
	}
	body := `{"invoice_id":"inv_c","amount_cents":100,"currency":"EUR"}`
	if o, te := run(pay, "k1", body); o != tools.Success {
		t.Fatalf("success: %s %v", o, te)
	}
	if o, te := run(pay, "k1", `{"invoice_id":"inv_other","amount_cents":100,"currency":"EUR"}`); o != tools.Definite || te.Code != "http_422" {
		t.Fatalf("same key, other body: %s %v", o, te)
	}
	sb.SetFaults(sandbox.Faults{ErrorRate: 1})
	if o, te := run(pay, "k2", body); o != tools.Definite || te.Code != "http_402" {
		t.Fatalf("declined: %s %v", o, te)
	}
	sb.SetFaults(sandbox.Faults{ServerErrorRate: 1})
	if o, te := run(pay, "k3", body); o != tools.Ambiguous || te.Code != "http_500" {
		t.Fatalf("500: %s %v", o, te)
	}
	sb.SetFaults(sandbox.Faults{DropAfterEffectRate: 1})
	if o, te := run(ticket, "k4", `{"title":"t","body":"b"}`); o != tools.Ambiguous || te.Code != "connection_lost" {
		t.Fatalf("dropped: %s %v", o, te)
	}
	// The same key while the first request is still processed downstream: 409, retry later.
	sb.SetFaults(sandbox.Faults{LatencyMS: 500})
	var wg sync.WaitGroup
	outcomes := make([]tools.Outcome, 2)
	errs := make([]*tools.Error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); outcomes[i], errs[i] = run(pay, "k5", body) }()
	}
	wg.Wait()
	busy := 0 // the one that found the key in flight
	if outcomes[0] == tools.Success {
		busy = 1
	}
	if outcomes[1-busy] != tools.Success || outcomes[busy] != tools.Ambiguous || errs[busy].Code != "http_409" || errs[busy].RetryAfter <= 0 {
		t.Fatalf("same key twice at once: %v %v / %v %v", outcomes[0], errs[0], outcomes[1], errs[1])
	}
}
