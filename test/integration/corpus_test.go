package integration

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// badInput is one line of testdata/bad_inputs.jsonl.
type badInput struct {
	Name       string            `json:"name"`
	Subject    string            `json:"subject"`
	Body       *string           `json:"body"`
	BodyBase64 string            `json:"body_base64"`
	Gen        string            `json:"gen"` // deep:N (nesting), pad:N or pad:near_max (a valid job padded to N bytes)
	Headers    map[string]string `json:"headers"`
	// Expect is dlq:<reason>, rejected:<code>, or ok:<why> for an input
	// that is harmless as sent (a newline in a header value reaches the
	// consumer folded into spaces: it cannot inject a header such as a
	// forged Toolq-Key).
	Expect string `json:"expect"`
}

// TestBadInputCorpus runs every entry of testdata/bad_inputs.jsonl through
// a live consumer, each followed by a valid job: each bad input is
// dead-lettered or rejected with its reason, the consumer never stops, and
// every valid job around them is answered well within its tool's timeout.
func TestBadInputCorpus(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	e.startWorker(options{}, nil)
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
		ack, err := e.js.PublishMsg(ctx, msg)
		switch {
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
	if len(out) < 30 {
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
