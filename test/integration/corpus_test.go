package integration

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tracing"
)

// badInput is one line of testdata/bad_inputs.jsonl.
type badInput struct {
	Name       string            `json:"name"`
	Subject    string            `json:"subject"`
	Body       *string           `json:"body"`
	BodyBase64 string            `json:"body_base64"`
	Gen        string            `json:"gen"` // deep:N (nesting), pad:N or pad:near_max (a valid job padded to N bytes)
	Headers    map[string]string `json:"headers"`
	// HeaderValues sets headers of several values; KEY in a value is the
	// key of the body (when it is a job).
	HeaderValues map[string][]string `json:"header_values"`
	// HeaderGen generates headers: big:<Name>:<N> (one header of N bytes),
	// big:<Name>:near_limit or :over_limit (one header that fills the
	// header block to JetStream's 64 KiB limit, or one byte over),
	// many:near_limit or many:over_limit (small headers, as many as fill
	// it), repeat:<Name>:<N> (a valid traceparent value N times),
	// tracestate:max (32 members of 256-byte values, W3C's limits) and
	// baggage:big (valid members over 60 KiB).
	HeaderGen string `json:"header_gen"`
	// Expect is dlq:<reason>, rejected:<code>, ok:<why> for an input that
	// is harmless as sent (a newline in a header value reaches the
	// consumer folded into spaces: it cannot inject a header such as a
	// forged Toolq-Key), or refused:<why> for one JetStream refuses to
	// store: the publisher is told, and nothing is answered.
	Expect string `json:"expect"`
}

// TestBadInputCorpus runs every entry of testdata/bad_inputs.jsonl through
// a live consumer, each followed by a valid job: each bad input is
// dead-lettered or rejected with its reason (or refused by JetStream at
// publication), the consumer never stops, and every valid job around them
// is answered well within its tool's timeout. The worker propagates the
// W3C trace context and baggage, so odd traceparent, tracestate and
// baggage headers reach its results.
func TestBadInputCorpus(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	e.startWorker(options{propagator: tracing.Propagator()}, nil)
	corpus := readCorpus(t)
	c := conv(t)
	ctx := context.Background()
	maxPayload := int(e.nc.MaxPayload())
	type published struct {
		in    badInput
		seq   uint64
		toolU string
	}
	var sent []published
	var valid []*jobs.Job
	var validAt []time.Time
	for i, in := range corpus {
		toolU := fmt.Sprintf("toolu_bad_%d", i)
		body := corpusBody(t, in, c, toolU, maxPayload)
		msg := nats.NewMsg(in.Subject)
		msg.Data = body
		msg.Header.Set("X-Case", fmt.Sprint(i))
		for k, v := range in.Headers {
			msg.Header.Set(k, v)
		}
		corpusHeaders(t, in, msg)
		ack, err := e.js.PublishMsg(ctx, msg)
		switch {
		case strings.HasPrefix(in.Expect, "refused:"):
			if err == nil {
				t.Errorf("%s: JetStream stored it (sequence %d)", in.Name, ack.Sequence)
			}
		case err != nil:
			t.Fatalf("%s: publish: %v", in.Name, err)
		default:
			sent = append(sent, published{in, ack.Sequence, toolU})
		}
		j := job(c, int64(i), "send_payment", payment(fmt.Sprintf("valid-%d", i)))
		e.publish(j)
		valid, validAt = append(valid, j), append(validAt, time.Now())
	}
	for i, j := range valid {
		r := e.await(j)
		if r.Status != jobs.StatusOK {
			t.Fatalf("valid job after %q: %+v", corpus[i].Name, r)
		}
	}
	if late := time.Since(validAt[0]); late > 20*time.Second {
		t.Fatalf("the valid jobs took %s: delayed by the bad ones", late)
	}

	dead := 0
	for _, p := range sent {
		if strings.HasPrefix(p.in.Expect, "dlq:") {
			dead++
		}
	}
	testenv.Eventually(t, 10*time.Second, "every bad message dead-lettered", func() bool { return len(e.deadLetters()) >= dead })
	byCase := map[string]nats.Header{}
	for _, m := range e.deadLetters() {
		byCase[m.Headers().Get("X-Case")] = m.Headers()
	}
	harmless := 0
	results := map[string]*jobs.Result{}
	for _, r := range e.results(c) {
		results[r.ToolUseID] = r
	}
	for i, p := range sent {
		kind, reason, _ := strings.Cut(p.in.Expect, ":")
		idx := fmt.Sprint(indexOf(corpus, p.in))
		switch kind {
		case "dlq":
			h, ok := byCase[idx]
			if !ok || h.Get(jobs.HeaderDLQReason) != reason || h.Get(jobs.HeaderDLQDetail) == "" || h.Get(jobs.HeaderDLQStreamSeq) != fmt.Sprint(p.seq) {
				t.Errorf("%s: dead letter %v, want reason %s with its detail and sequence", p.in.Name, h, reason)
			}
			if _, answered := results[p.toolU]; answered {
				t.Errorf("%s: dead-lettered and also answered", p.in.Name)
			}
			if strings.HasSuffix(p.in.HeaderGen, "near_limit") && h.Get(jobs.HeaderDLQHeadersOmitted) == "" {
				t.Errorf("%s: a dead letter that cannot hold every header does not say which it dropped", p.in.Name)
			}
		case "rejected":
			r, ok := results[p.toolU]
			if !ok || r.Status != jobs.StatusRejected || r.Error == nil || r.Error.Code != reason {
				t.Errorf("%s: result %+v, want rejected with %s", p.in.Name, r, reason)
			}
			if _, dl := byCase[idx]; dl {
				t.Errorf("%s: rejected and also dead-lettered", p.in.Name)
			}
		case "ok":
			if r, ok := results[p.toolU]; !ok || r.Status != jobs.StatusOK {
				t.Errorf("%s: result %+v, want ok (%s)", p.in.Name, r, reason)
			}
			harmless++
		default:
			t.Fatalf("line %d: unknown expectation %q", i, p.in.Expect)
		}
	}
	if n := len(e.sandbox.Payments()); n != len(valid)+harmless {
		t.Fatalf("%d payments for %d valid jobs and %d harmless inputs: a bad input took effect", n, len(valid), harmless)
	}
	e.settled()
}

func readCorpus(t *testing.T) []badInput {
	t.Helper()
	f, err := os.Open("testdata/bad_inputs.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []badInput
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var in badInput
		if err := json.Unmarshal(sc.Bytes(), &in); err != nil {
			t.Fatalf("bad_inputs.jsonl: %v", err)
		}
		out = append(out, in)
	}
	if len(out) < 50 {
		t.Fatalf("only %d inputs in the corpus", len(out))
	}
	return out
}

func indexOf(corpus []badInput, in badInput) int {
	for i := range corpus {
		if corpus[i].Name == in.Name {
			return i
		}
	}
	return -1
}

// corpusBody builds the body of one input, with the placeholders CONV and
// TUID replaced by this test's conversation and the input's tool_use_id.
func corpusBody(t *testing.T, in badInput, conv, toolU string, maxPayload int) []byte {
	t.Helper()
	job := func(invoice string) string {
		return fmt.Sprintf(`{"version":1,"conversation_id":%q,"turn_index":0,"tool":"send_payment","tool_use_id":%q,"args":{"invoice_id":%q,"amount_cents":1,"currency":"EUR"}}`, conv, toolU, invoice)
	}
	switch {
	case in.Body != nil:
		return []byte(strings.NewReplacer("CONV", conv, "TUID", toolU).Replace(*in.Body))
	case in.BodyBase64 != "":
		b, err := base64.StdEncoding.DecodeString(in.BodyBase64)
		if err != nil {
			t.Fatal(err)
		}
		return []byte(strings.NewReplacer("CONV", conv, "TUID", toolU).Replace(string(b)))
	case strings.HasPrefix(in.Gen, "deep:"):
		var n int
		fmt.Sscan(strings.TrimPrefix(in.Gen, "deep:"), &n)
		return []byte(strings.Replace(job("i"), `"invoice_id":"i"`, `"invoice_id":"i","deep":`+strings.Repeat("[", n)+strings.Repeat("]", n), 1))
	case in.Gen == "pad:near_max":
		base := job("")
		return []byte(job(strings.Repeat("x", maxPayload-300-len(base))))
	case strings.HasPrefix(in.Gen, "pad:"):
		var n int
		fmt.Sscan(strings.TrimPrefix(in.Gen, "pad:"), &n)
		return []byte(job(strings.Repeat("x", n)))
	}
	t.Fatalf("%s: no body", in.Name)
	return nil
}

// jetStreamHeaderLimit is the largest header block a stream stores
// (nats-server: "header size exceeds maximum allowed of 64k").
const jetStreamHeaderLimit = 65535

// headerBlock is the size of msg's headers on the wire.
func headerBlock(msg *nats.Msg) int { return msg.Size() - len(msg.Subject) - len(msg.Data) }

// corpusHeaders adds the headers of in's HeaderValues and HeaderGen to msg.
func corpusHeaders(t *testing.T, in badInput, msg *nats.Msg) {
	t.Helper()
	var key string
	if j, err := jobs.DecodeJob(msg.Data); err == nil {
		if key, err = j.Key(); err != nil {
			t.Fatal(err)
		}
	}
	for k, vs := range in.HeaderValues {
		for _, v := range vs {
			msg.Header.Add(k, strings.ReplaceAll(v, "KEY", key))
		}
	}
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	gen := strings.Split(in.HeaderGen, ":")
	over := 0
	if gen[len(gen)-1] == "over_limit" {
		over = 1
	}
	switch {
	case in.HeaderGen == "":
	case gen[0] == "big" && len(gen) == 3:
		n, err := strconv.Atoi(gen[2])
		if err != nil { // near_limit, over_limit
			msg.Header.Set(gen[1], "")
			n = jetStreamHeaderLimit - headerBlock(msg) + over
		}
		msg.Header.Set(gen[1], strings.Repeat("h", n))
	case gen[0] == "many" && len(gen) == 2:
		line := len("X-H-00000: ") + 20 + len("\r\n")
		for i := 0; headerBlock(msg)+line <= jetStreamHeaderLimit; i++ {
			msg.Header.Set(fmt.Sprintf("X-H-%05d", i), strings.Repeat("v", 20))
		}
		if over == 1 {
			msg.Header.Set("X-H-over", strings.Repeat("v", 20))
		}
	case gen[0] == "repeat" && len(gen) == 3:
		n, err := strconv.Atoi(gen[2])
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			msg.Header.Add(gen[1], traceparent)
		}
	case in.HeaderGen == "tracestate:max":
		var members []string
		for i := range 32 {
			members = append(members, fmt.Sprintf("vendor%02d=%s", i, strings.Repeat("s", 256)))
		}
		msg.Header.Set("traceparent", traceparent)
		msg.Header.Set("tracestate", strings.Join(members, ","))
	case in.HeaderGen == "baggage:big":
		var members []string
		for i := 0; len(members)*40 < 60<<10; i++ {
			members = append(members, fmt.Sprintf("k%05d=%s", i, strings.Repeat("b", 32)))
		}
		msg.Header.Set("baggage", strings.Join(members, ","))
	default:
		t.Fatalf("%s: unknown header_gen %q", in.Name, in.HeaderGen)
	}
}
