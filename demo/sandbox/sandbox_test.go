package sandbox_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolq/toolq/demo/sandbox"
)

func start(t *testing.T, cfg sandbox.Config) (*sandbox.Server, string) {
	t.Helper()
	s, err := sandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv.URL
}

func post(t *testing.T, url, key, body string) (int, map[string]any, http.Header) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var m map[string]any
	json.Unmarshal(data, &m)
	return resp.StatusCode, m, resp.Header
}

const payment = `{"invoice_id":"inv_1","amount_cents":500,"currency":"EUR"}`

func TestPaymentsHonourIdempotencyKey(t *testing.T) {
	t.Parallel()
	s, url := start(t, sandbox.Config{})
	code1, first, h1 := post(t, url+"/v1/payments", "key-1", payment)
	code2, again, h2 := post(t, url+"/v1/payments", "key-1", `{"currency":"EUR","amount_cents":500.0,"invoice_id":"inv_1"}`)
	if code1 != 200 || code2 != 200 || first["id"] != again["id"] || h1.Get("Idempotent-Replayed") != "" || h2.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("same key and body: %d %v / %d %v %v", code1, first, code2, again, h2)
	}
	if code, _, _ := post(t, url+"/v1/payments", "key-1", `{"invoice_id":"inv_2","amount_cents":500,"currency":"EUR"}`); code != 422 {
		t.Fatalf("same key, other body: %d", code)
	}
	if code, _, _ := post(t, url+"/v1/payments", "key-2", payment); code != 200 {
		t.Fatalf("other key: %d", code)
	}
	ps := s.Payments()
	if len(ps) != 2 || ps[0].IdempotencyKey != "key-1" || ps[1].IdempotencyKey != "key-2" {
		t.Fatalf("payments %+v", ps)
	}
	if code, _, _ := post(t, url+"/v1/payments", "", `{"invoice_id":"x"}`); code != 400 {
		t.Fatalf("bad body: %d", code)
	}
}

// TestConcurrentSameKey: 20 concurrent requests with one key make one
// payment; the others get the first response or 409 while it is in flight.
func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	s, url := start(t, sandbox.Config{Faults: sandbox.Faults{LatencyMS: 100}})
	var wg sync.WaitGroup
	codes := make(chan int, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, _ := post(t, url+"/v1/payments", "same", payment)
			codes <- code
		}()
	}
	wg.Wait()
	close(codes)
	seen := map[int]int{}
	for c := range codes {
		seen[c]++
	}
	if len(s.Payments()) != 1 || seen[200] < 1 || seen[200]+seen[409] != 20 {
		t.Fatalf("%d payments, codes %v", len(s.Payments()), seen)
	}
}

func TestTicketsHaveNoDedupe(t *testing.T) {
	t.Parallel()
	s, url := start(t, sandbox.Config{})
	body := `{"title":"refund","body":"please"}`
	_, a, _ := post(t, url+"/v1/tickets", "k", body)
	_, b, _ := post(t, url+"/v1/tickets", "k", body)
	if len(s.Tickets()) != 2 || a["id"] == b["id"] {
		t.Fatalf("two identical requests: %d tickets (%v, %v)", len(s.Tickets()), a, b)
	}
}

// TestLatencyHeaderSlowsOneRequest pins HeaderLatency (a slow downstream
// for one tool) and that a ticket records when
// its request arrived, before the latency.
func TestLatencyHeaderSlowsOneRequest(t *testing.T) {
	t.Parallel()
	s, url := start(t, sandbox.Config{})
	began := time.Now()
	req, _ := http.NewRequest("POST", url+"/v1/tickets", strings.NewReader(`{"title":"slow","body":"b"}`))
	req.Header.Set(sandbox.HeaderLatency, "300")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if took := time.Since(began); took < 300*time.Millisecond {
		t.Fatalf("a write with a latency of 300 ms took %v", took)
	}
	tk := s.Tickets()[0]
	if d := tk.CreatedAt.Sub(tk.ReceivedAt); d < 300*time.Millisecond {
		t.Fatalf("the ticket was made %v after its request arrived, want the latency of 300 ms at least", d)
	}
}

func TestFaultsAndListing(t *testing.T) {
	t.Parallel()
	s, url := start(t, sandbox.Config{})
	post(t, url+"/v1/payments", "k1", payment)
	// Set faults at run time over HTTP: every payment now fails definitely.
	if code, _, _ := post(t, url+"/v1/_faults", "", `{"error_rate":1}`); code != 200 || s.Faults().ErrorRate != 1 {
		t.Fatalf("set faults: %d %+v", code, s.Faults())
	}
	if code, _, _ := post(t, url+"/v1/payments", "k2", payment); code != 402 {
		t.Fatalf("with error_rate 1: %d", code)
	}
	if code, _, _ := post(t, url+"/v1/_faults", "", `{"error_rate":2}`); code != 400 {
		t.Fatalf("bad rate: %d", code)
	}
	s.SetFaults(sandbox.Faults{ServerErrorRate: 1})
	if code, _, _ := post(t, url+"/v1/payments", "k3", payment); code != 500 {
		t.Fatalf("with server_error_rate 1: %d", code)
	}
	// Drop after effect: the client sees a broken connection, the payment exists.
	s.SetFaults(sandbox.Faults{DropAfterEffectRate: 1})
	req, _ := http.NewRequest("POST", url+"/v1/payments", strings.NewReader(payment))
	req.Header.Set("Idempotency-Key", "k4")
	req.GetBody = nil // or net/http re-sends a request with Idempotency-Key by itself
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("drop_after_effect answered")
	}
	s.SetFaults(sandbox.Faults{})
	if len(s.Payments()) != 2 {
		t.Fatalf("%d payments", len(s.Payments()))
	}
	// The retry with the same key gets the stored answer of the dropped call.
	if code, m, h := post(t, url+"/v1/payments", "k4", payment); code != 200 || h.Get("Idempotent-Replayed") != "true" || m["id"] != s.Payments()[1].ID {
		t.Fatalf("retry after a drop: %d %v", code, m)
	}
	resp, err := http.Get(url + "/v1/orders?query=inv_")
	if err != nil {
		t.Fatal(err)
	}
	var orders struct{ Data []sandbox.Payment }
	json.NewDecoder(resp.Body).Decode(&orders)
	resp.Body.Close()
	if len(orders.Data) != 2 {
		t.Fatalf("orders: %+v", orders)
	}
	resp, _ = http.Get(url + "/v1/payments")
	var list struct{ Data []sandbox.Payment }
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Data) != 2 || list.Data[0].IdempotencyKey != "k1" || string(list.Data[0].Request) != payment {
		t.Fatalf("list: %+v", list)
	}
}

func TestStatePersists(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sandbox.json")
	_, url := start(t, sandbox.Config{StatePath: path})
	_, first, _ := post(t, url+"/v1/payments", "k", payment)
	s2, url2 := start(t, sandbox.Config{StatePath: path})
	code, again, _ := post(t, url2+"/v1/payments", "k", payment)
	if len(s2.Payments()) != 1 || code != 200 || again["id"] != first["id"] {
		t.Fatalf("after restart: %d payments, %d %v", len(s2.Payments()), code, again)
	}

}

// TestRedirectAfterEffectMakesTheEffectAndAnswers302: the Post/Redirect/Get
// fault applies the write, then answers 302 Found to what it made.
func TestRedirectAfterEffectMakesTheEffectAndAnswers302(t *testing.T) {
	t.Parallel()
	s, url := start(t, sandbox.Config{Faults: sandbox.Faults{RedirectAfterEffectRate: 1}})
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for path, made := range map[string]func() int{
		"/v1/tickets":  func() int { return len(s.Tickets()) },
		"/v1/payments": func() int { return len(s.Payments()) },
	} {
		body := `{"title":"refund","body":"please"}`
		if path == "/v1/payments" {
			body = payment
		}
		req, _ := http.NewRequest("POST", url+path, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", `"k-redirect"`)
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusFound || !strings.HasPrefix(resp.Header.Get("Location"), path+"/") || made() != 1 {
			t.Fatalf("%s: %d Location %q, %d made; want 302 to what was made, and one", path, resp.StatusCode, resp.Header.Get("Location"), made())
		}
	}
}
