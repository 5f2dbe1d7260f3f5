// Package sandbox is a Stripe-like payments and tickets API with fault knobs,
// for toolq's demo, tests and benchmarks: it stands in for the downstream a
// tool calls (it does not isolate tools). It records every effect with the
// idempotency key it carried, so a test can count what really happened.
//
//	POST /v1/payments   honours Idempotency-Key: same key and body → the first
//	                    response again (Idempotent-Replayed: true); same key,
//	                    other body → 422; same key still in flight → 409
//	POST /v1/tickets    no dedupe: a new ticket every time
//	GET  /v1/orders     ?query=…: the payments whose invoice_id contains it
//	GET  /v1/payments   every payment, with its key and request body
//	GET  /v1/tickets    every ticket, likewise
//	GET  /v1/_faults    the fault knobs; POST /v1/_faults sets them
//	POST /v1/_reset     forget every effect
//	/mcp                the same payments, tickets and orders as an MCP
//	                    server (Streamable HTTP; see mcpServer), whose
//	                    send_payment honours the key toolq sends in _meta
package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolq/toolq/internal/jcs"
)

// Faults are the knobs that make the sandbox misbehave. Rates are
// probabilities in [0, 1], drawn per request.
type Faults struct {
	LatencyMS int `json:"latency_ms"` // every write takes this long (the first request with a key is in flight meanwhile)
	// ErrorRate answers a definite failure (402 card_declined, 400 for
	// tickets) without applying the effect.
	ErrorRate float64 `json:"error_rate"`
	// ServerErrorRate answers 500 without applying the effect.
	ServerErrorRate float64 `json:"server_error_rate"`
	// DropAfterEffectRate applies the effect, then resets the connection
	// without answering: the client cannot know it happened.
	DropAfterEffectRate float64 `json:"drop_after_effect_rate"`
	// RedirectAfterEffectRate applies the effect, then answers 302 Found
	// with the Location of what it made, as Post/Redirect/Get does: the
	// effect happened, and the answer does not say so.
	RedirectAfterEffectRate float64 `json:"redirect_after_effect_rate"`
}

func (f Faults) validate() error {
	for name, r := range map[string]float64{"error_rate": f.ErrorRate, "server_error_rate": f.ServerErrorRate, "drop_after_effect_rate": f.DropAfterEffectRate,
		"redirect_after_effect_rate": f.RedirectAfterEffectRate} {
		if r < 0 || r > 1 {
			return fmt.Errorf("%s %v: want a probability between 0 and 1", name, r)
		}
	}
	if f.LatencyMS < 0 {
		return errors.New("latency_ms must not be negative")
	}
	return nil
}

// Payment is one payment the sandbox made.
type Payment struct {
	ID             string          `json:"id"`
	InvoiceID      string          `json:"invoice_id"`
	AmountCents    int64           `json:"amount_cents"`
	Currency       string          `json:"currency"`
	Status         string          `json:"status"`
	IdempotencyKey string          `json:"idempotency_key"`
	Request        json.RawMessage `json:"request"`
	CreatedAt      time.Time       `json:"created_at"`
}

// Ticket is one ticket the sandbox created.
type Ticket struct {
	ID             string          `json:"id"`
	Title          string          `json:"title"`
	Body           string          `json:"body"`
	IdempotencyKey string          `json:"idempotency_key"`
	Request        json.RawMessage `json:"request"`
	ReceivedAt     time.Time       `json:"received_at"` // when the request arrived
	CreatedAt      time.Time       `json:"created_at"`
}

// Config configures a Server.
type Config struct {
	Faults    Faults
	StatePath string // when set, effects are persisted to this JSON file and loaded at start
}

// Server is the sandbox API. It is an http.Handler.
type Server struct {
	mu        sync.Mutex
	faults    Faults
	payments  []Payment
	tickets   []Ticket
	idem      map[string]*idemEntry
	statePath string
	rng       *rand.Rand
	mux       *http.ServeMux
	dropped   sync.Map // MCP calls over HTTP whose answer is dropped (see mcpHandler)
}

type idemEntry struct {
	Canonical string          `json:"canonical"` // the canonical request body
	Done      bool            `json:"done"`
	Status    int             `json:"status"`
	Response  json.RawMessage `json:"response"`
}

type state struct {
	Payments    []Payment             `json:"payments"`
	Tickets     []Ticket              `json:"tickets"`
	Idempotency map[string]*idemEntry `json:"idempotency"`
}

// New returns a sandbox, loading its state file when there is one.
func New(cfg Config) (*Server, error) {
	if err := cfg.Faults.validate(); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s := &Server{faults: cfg.Faults, idem: map[string]*idemEntry{}, statePath: cfg.StatePath,
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))}
	if s.statePath != "" {
		data, err := os.ReadFile(s.statePath)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("sandbox: %w", err)
		default:
			var st state
			if err := json.Unmarshal(data, &st); err != nil {
				return nil, fmt.Errorf("sandbox: state file %s: %w", s.statePath, err)
			}
			s.payments, s.tickets = st.Payments, st.Tickets
			for k, e := range st.Idempotency {
				if e.Done {
					s.idem[k] = e
				}
			}
		}
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/payments", s.createPayment)
	s.mux.HandleFunc("GET /v1/payments", func(w http.ResponseWriter, r *http.Request) { s.list(w, func() any { return s.payments }) })
	s.mux.HandleFunc("POST /v1/tickets", s.createTicket)
	s.mux.HandleFunc("GET /v1/tickets", func(w http.ResponseWriter, r *http.Request) { s.list(w, func() any { return s.tickets }) })
	s.mux.HandleFunc("GET /v1/orders", s.orders)
	s.mux.Handle("/mcp", s.mcpHandler())
	s.mux.HandleFunc("GET /v1/_faults", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, s.Faults()) })
	s.mux.HandleFunc("POST /v1/_faults", s.setFaults)
	s.mux.HandleFunc("POST /v1/_reset", func(w http.ResponseWriter, r *http.Request) {
		s.Reset()
		writeJSON(w, http.StatusOK, map[string]bool{"reset": true})
	})
	return s, nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Faults returns the current fault knobs.
func (s *Server) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// SetFaults changes the fault knobs at run time.
func (s *Server) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f
	return nil
}

// Payments returns every payment made so far.
func (s *Server) Payments() []Payment {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Payment(nil), s.payments...)
}

// Tickets returns every ticket created so far.
func (s *Server) Tickets() []Ticket {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Ticket(nil), s.tickets...)
}

// Reset forgets every effect and idempotency record.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.payments, s.tickets, s.idem = nil, nil, map[string]*idemEntry{}
	s.persistLocked()
}

var currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)

type paymentRequest struct {
	InvoiceID   string `json:"invoice_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

func (s *Server) createPayment(w http.ResponseWriter, r *http.Request) {
	body, canonical, ok := readBody(w, r)
	if !ok {
		return
	}
	var req paymentRequest
	dec := json.NewDecoder(strings.NewReader(canonical)) // canonical: 500.0 is 500
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.InvoiceID == "" || req.AmountCents < 1 || !currencyPattern.MatchString(req.Currency) {
		writeError(w, http.StatusBadRequest, "invalid_request", "want {invoice_id: string, amount_cents: integer ≥ 1, currency: ISO 4217 code}")
		return
	}
	key, err := idempotencyKey(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_idempotency_key", err.Error())
		return
	}
	a := s.pay(req, key, body, canonical, latencyOf(r, s.Faults()))
	if a.replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	switch {
	case a.drop:
		drop(w)
	case a.redirect != "":
		http.Redirect(w, r, a.redirect, http.StatusFound)
	default:
		writeRaw(w, a.status, a.body)
	}
}

// answer is how the sandbox answers one write: a status and body, or, after
// the effect, a dropped connection or a redirect to what it made.
type answer struct {
	status   int
	body     []byte
	replayed bool   // the first answer for the key, again
	drop     bool   // apply the effect, then reset the connection
	redirect string // apply the effect, then answer 302 to this path
}

// pay makes one payment, as POST /v1/payments and the MCP tool
// send_payment do: a key seen before gets its first answer (or 422 for
// another body, 409 while it is in flight), and the faults apply.
func (s *Server) pay(req paymentRequest, key string, body []byte, canonical string, latency time.Duration) answer {
	s.mu.Lock()
	if key != "" {
		if e, seen := s.idem[key]; seen {
			s.mu.Unlock()
			switch {
			case e.Canonical != canonical:
				return answer{status: http.StatusUnprocessableEntity, body: errorBody("idempotency_error", "this key was used with another request body")}
			case !e.Done:
				return answer{status: http.StatusConflict, body: errorBody("idempotency_error", "a request with this key is still being processed")}
			default:
				return answer{status: e.Status, body: e.Response, replayed: true}
			}
		}
		s.idem[key] = &idemEntry{Canonical: canonical}
	}
	faults := s.faults
	roll := s.rng.Float64()
	s.mu.Unlock()

	time.Sleep(latency)

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case roll < faults.ServerErrorRate:
		delete(s.idem, key) // not processed: the key may be used again
		return answer{status: http.StatusInternalServerError, body: errorBody("server_error", "injected server error")}
	case roll < faults.ServerErrorRate+faults.ErrorRate:
		resp := errorBody("card_declined", "injected decline")
		s.finishLocked(key, http.StatusPaymentRequired, resp)
		return answer{status: http.StatusPaymentRequired, body: resp}
	}
	p := Payment{ID: fmt.Sprintf("pay_%06d", len(s.payments)+1), InvoiceID: req.InvoiceID, AmountCents: req.AmountCents,
		Currency: req.Currency, Status: "succeeded", IdempotencyKey: key, Request: body, CreatedAt: time.Now().UTC()}
	s.payments = append(s.payments, p)
	resp, _ := json.Marshal(map[string]any{"id": p.ID, "object": "payment", "invoice_id": p.InvoiceID,
		"amount_cents": p.AmountCents, "currency": p.Currency, "status": p.Status})
	s.finishLocked(key, http.StatusOK, resp)
	switch {
	case roll < faults.ServerErrorRate+faults.ErrorRate+faults.DropAfterEffectRate:
		return answer{status: http.StatusOK, body: resp, drop: true}
	case roll < faults.ServerErrorRate+faults.ErrorRate+faults.DropAfterEffectRate+faults.RedirectAfterEffectRate:
		return answer{status: http.StatusOK, body: resp, redirect: "/v1/payments/" + p.ID}
	default:
		return answer{status: http.StatusOK, body: resp}
	}
}

// HeaderLatency, on a write request, sets how long that write takes in
// milliseconds (a slow downstream for one tool), instead of the latency of
// the faults.
const HeaderLatency = "Sandbox-Latency-Ms"

// latencyOf is how long a write takes: HeaderLatency when the request has
// a valid one, else the latency of the faults.
func latencyOf(r *http.Request, f Faults) time.Duration {
	ms := f.LatencyMS
	if v, err := strconv.Atoi(r.Header.Get(HeaderLatency)); err == nil && v >= 0 && v <= 60_000 {
		ms = v
	}
	return time.Duration(ms) * time.Millisecond
}

func (s *Server) finishLocked(key string, status int, resp []byte) {
	if key != "" {
		s.idem[key] = &idemEntry{Canonical: s.idem[key].Canonical, Done: true, Status: status, Response: resp}
	}
	s.persistLocked()
}

type ticketRequest struct {
	Title string `json:"title"`
	Body  string `json:"body"`
}

func (s *Server) createTicket(w http.ResponseWriter, r *http.Request) {
	received := time.Now().UTC()
	body, _, ok := readBody(w, r)
	if !ok {
		return
	}
	var req ticketRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Title == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", "want {title: string, body: string}")
		return
	}
	key, _ := idempotencyKey(r) // recorded, never used: this endpoint has no dedupe
	a := s.ticket(req, key, body, received, latencyOf(r, s.Faults()))
	switch {
	case a.drop:
		drop(w)
	case a.redirect != "":
		http.Redirect(w, r, a.redirect, http.StatusFound)
	default:
		writeRaw(w, a.status, a.body)
	}
}

// ticket opens one ticket, as POST /v1/tickets and the MCP tool
// create_ticket do: every request is a new ticket (no dedupe), and the
// faults apply.
func (s *Server) ticket(req ticketRequest, key string, body []byte, received time.Time, latency time.Duration) answer {
	s.mu.Lock()
	faults := s.faults
	roll := s.rng.Float64()
	s.mu.Unlock()
	time.Sleep(latency)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case roll < faults.ServerErrorRate:
		return answer{status: http.StatusInternalServerError, body: errorBody("server_error", "injected server error")}
	case roll < faults.ServerErrorRate+faults.ErrorRate:
		return answer{status: http.StatusBadRequest, body: errorBody("ticket_rejected", "injected rejection")}
	}
	t := Ticket{ID: fmt.Sprintf("tkt_%06d", len(s.tickets)+1), Title: req.Title, Body: req.Body, IdempotencyKey: key,
		Request: body, ReceivedAt: received, CreatedAt: time.Now().UTC()}
	s.tickets = append(s.tickets, t)
	s.persistLocked()
	resp, _ := json.Marshal(map[string]any{"id": t.ID, "object": "ticket", "title": t.Title})
	switch {
	case roll < faults.ServerErrorRate+faults.ErrorRate+faults.DropAfterEffectRate:
		return answer{status: http.StatusOK, body: resp, drop: true}
	case roll < faults.ServerErrorRate+faults.ErrorRate+faults.DropAfterEffectRate+faults.RedirectAfterEffectRate:
		return answer{status: http.StatusOK, body: resp, redirect: "/v1/tickets/" + t.ID}
	default:
		return answer{status: http.StatusOK, body: resp}
	}
}

func (s *Server) orders(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query().Get("query")
	s.mu.Lock()
	matches := []Payment{}
	for _, p := range s.payments {
		if q == "" || strings.Contains(p.InvoiceID, q) {
			matches = append(matches, p)
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"query": q, "data": matches})
}

func (s *Server) list(w http.ResponseWriter, items func() any) {
	s.mu.Lock()
	data, _ := json.Marshal(map[string]any{"data": items()})
	s.mu.Unlock()
	writeRaw(w, http.StatusOK, data)
}

func (s *Server) setFaults(w http.ResponseWriter, r *http.Request) {
	f := s.Faults()
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	if err := s.SetFaults(f); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, f)
}

// persistLocked writes the state file, atomically, when there is one.
func (s *Server) persistLocked() {
	if s.statePath == "" {
		return
	}
	data, err := json.Marshal(state{Payments: s.payments, Tickets: s.tickets, Idempotency: s.idem})
	if err != nil {
		return
	}
	tmp := s.statePath + ".tmp"
	if os.MkdirAll(filepath.Dir(s.statePath), 0o750) == nil && os.WriteFile(tmp, data, 0o600) == nil {
		os.Rename(tmp, s.statePath)
	}
}

// idempotencyKey reads the Idempotency-Key header: an sf-string ("…") as
// draft-ietf-httpapi-idempotency-key-header says, or, leniently, a bare token.
func idempotencyKey(r *http.Request) (string, error) {
	v := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if strings.HasPrefix(v, `"`) {
		k, err := strconv.Unquote(v)
		if err != nil || k == "" {
			return "", fmt.Errorf("Idempotency-Key %s is not a structured-field string", v)
		}
		return k, nil
	}
	if len(v) > 255 {
		return "", errors.New("Idempotency-Key longer than 255 characters")
	}
	return v, nil
}

func readBody(w http.ResponseWriter, r *http.Request) (body []byte, canonical string, ok bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return nil, "", false
	}
	canon, err := jcs.CanonicalizeObject(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", err.Error())
		return nil, "", false
	}
	// Kept with the payment: without the spare capacity of the read buffer.
	return bytes.Clone(body), string(canon), true
}

// drop resets the connection without answering.
func drop(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		tcp.SetLinger(0) // RST, not FIN
	}
	conn.Close()
}

func errorBody(code, message string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"code": code, "message": message}})
	return b
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeRaw(w, status, errorBody(code, message))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	writeRaw(w, status, data)
}

func writeRaw(w http.ResponseWriter, status int, data []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(data)
}

// Listen serves the sandbox on addr (host:port; port 0 picks a free one)
// and returns its base URL and a function that shuts it down.
func (s *Server) Listen(addr string) (baseURL string, shutdown func(context.Context) error, err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("sandbox: listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	return "http://" + l.Addr().String(), srv.Shutdown, nil
}
