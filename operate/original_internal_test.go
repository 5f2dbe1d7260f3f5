package operate

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestNotOriginal: the message at a dead letter's job sequence is its
// original unless one of the checks below tells another call (a stream
// made again numbers from 1 again); each case fails one check alone, and
// the servers' clocks (for the time a job was stored) and a header value's
// surrounding spaces tell none.
func TestNotOriginal(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	body := `{"version":1,"tool":"send_payment","tool_use_id":"toolu_1"}`
	deadLetter := func() DeadLetter {
		return DeadLetter{Seq: 9, Time: at, Subject: "toolq.jobs.send_payment", JobSeq: 3, Body: body,
			Header: nats.Header{"X-Note": {"hi"}, "Nats-Msg-Id": {"dlq:3"}}}
	}
	original := func() *jetstream.RawStreamMsg {
		return &jetstream.RawStreamMsg{Subject: "toolq.jobs.send_payment", Sequence: 3, Time: at.Add(-10 * time.Millisecond),
			Data: []byte(body), Header: nats.Header{"X-Note": {"hi"}, "Nats-Msg-Id": {"job-1"}, "X-Other": {"o"}}}
	}
	omitted := func(size int) func(*DeadLetter, *jetstream.RawStreamMsg, *time.Time) {
		return func(d *DeadLetter, _ *jetstream.RawStreamMsg, _ *time.Time) { d.Body, d.BodyOmitted = "", size }
	}
	for _, tc := range []struct {
		name   string
		change func(d *DeadLetter, m *jetstream.RawStreamMsg, created *time.Time)
		want   string // in the reason; "": the original
	}{
		{"the original", func(*DeadLetter, *jetstream.RawStreamMsg, *time.Time) {}, ""},
		{"a header value sent with spaces around it", func(_ *DeadLetter, m *jetstream.RawStreamMsg, _ *time.Time) {
			m.Header["X-Note"] = []string{" hi \t"}
		}, ""},
		{"stored by a leader's clock 30s ahead", func(_ *DeadLetter, m *jetstream.RawStreamMsg, _ *time.Time) { m.Time = at.Add(30 * time.Second) }, ""},
		{"its body omitted, of its size", omitted(len(body)), ""},
		{"its body omitted, of a size unsaid", omitted(1), ""},
		{"in a stream made after the dead letter", func(_ *DeadLetter, _ *jetstream.RawStreamMsg, c *time.Time) { *c = at.Add(2 * time.Minute) }, "was made at"},
		{"stream made again within the leeway, body omitted, no headers", func(d *DeadLetter, m *jetstream.RawStreamMsg, c *time.Time) {
			d.Body, d.BodyOmitted, d.Header = "", len(body), nil
			m.Header, m.Time = nil, at.Add(31*time.Second)
			*c = at.Add(30 * time.Second)
		}, "was made at"},
		{"on another subject", func(_ *DeadLetter, m *jetstream.RawStreamMsg, _ *time.Time) { m.Subject = "toolq.jobs.refund" }, "it is on"},
		{"stored after the dead letter", func(_ *DeadLetter, m *jetstream.RawStreamMsg, _ *time.Time) { m.Time = at.Add(2 * time.Minute) }, "stored at"},
		{"another body", func(_ *DeadLetter, m *jetstream.RawStreamMsg, _ *time.Time) {
			m.Data = []byte(strings.Replace(body, "toolu_1", "toolu_2", 1))
		}, "body is not"},
		{"its body omitted, of another size", omitted(len(body) + 1), "bytes"},
		{"another header value", func(_ *DeadLetter, m *jetstream.RawStreamMsg, _ *time.Time) { m.Header["X-Note"] = []string{"ho"} }, "header X-Note"},
		{"without a header the dead letter kept", func(_ *DeadLetter, m *jetstream.RawStreamMsg, _ *time.Time) { delete(m.Header, "X-Note") }, "header X-Note"},
	} {
		d, m, created := deadLetter(), original(), at.Add(-time.Hour)
		tc.change(&d, m, &created)
		got := notOriginal(d, m, created)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: notOriginal = %q, want %q", tc.name, got, tc.want)
		}
	}
}
