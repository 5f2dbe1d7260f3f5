package soak

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
)

// checkFixture is a consistent run of one payment, one ticket and one
// read; each case breaks it in one way.
func checkFixture(t *testing.T) Observed {
	t.Helper()
	pub := func(id, tool string, turn int64, args string) *Published {
		j := jobs.Job{Version: 1, ConversationID: "c1", TurnIndex: turn, Tool: tool, ToolUseID: id, Args: json.RawMessage(args)}
		key, err := j.Key()
		if err != nil {
			t.Fatal(err)
		}
		return &Published{Job: j, Key: key, Class: classOf[tool], Route: routeOriginal}
	}
	pay := pub("tu_pay", toolPayment, 1, `{"invoice_id":"inv-c1-1","amount_cents":500,"currency":"EUR"}`)
	tkt := pub("tu_tkt", toolTicket, 2, `{"title":"t","body":"b"}`)
	read := pub("tu_read", toolSearch, 3, `{"query":"inv-c1-"}`)
	result := func(p *Published, status jobs.Status, attempts int, out string) jobs.Result {
		r := *jobs.NewResult(&p.Job, p.Key, status)
		r.Attempts = attempts
		if out != "" {
			r.Output = json.RawMessage(out)
		}
		return r
	}
	return Observed{
		Published: map[string]*Published{pay.Job.ToolUseID: pay, tkt.Job.ToolUseID: tkt, read.Job.ToolUseID: read},
		Results: []jobs.Result{
			result(pay, jobs.StatusOK, 2, `{"id":"pay_000001"}`),
			result(tkt, jobs.StatusOK, 1, `{"id":"tkt_000001"}`),
			result(read, jobs.StatusOK, 1, `{"query":"inv-c1-","data":[]}`),
		},
		Rows: map[string]ledger.Row{
			pay.Key: {Key: pay.Key, State: ledger.Completed, Attempt: 2, FirstToolUseID: "tu_pay", Result: json.RawMessage(`{"id":"pay_000001"}`)},
			tkt.Key: {Key: tkt.Key, State: ledger.Completed, Attempt: 1, FirstToolUseID: "tu_tkt", Result: json.RawMessage(`{"id":"tkt_000001"}`)},
		},
		Payments: []sandbox.Payment{{ID: "pay_000001", IdempotencyKey: pay.Key, Request: pay.Job.Args}},
		Tickets:  []sandbox.Ticket{{ID: "tkt_000001", IdempotencyKey: tkt.Key, Request: tkt.Job.Args}},
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	keyOf := func(o *Observed, id string) string { return o.Published[id].Key }
	tests := []struct {
		name   string
		want   string // the one violation kind; empty: none
		mutate func(o *Observed)
	}{
		{"consistent", "", func(o *Observed) {}},
		{"a job without a result", VLost, func(o *Observed) { o.Results = o.Results[1:] }},
		{"a dead letter settles a job", "", func(o *Observed) {
			o.Results = o.Results[1:]
			o.Payments = nil
			delete(o.Rows, keyOf(o, "tu_pay"))
			o.DeadLetters = []operate.DeadLetter{{Reason: jobs.DLQMaxDeliver, ToolUseID: "tu_pay"}}
		}},
		{"a result nobody asked for", VPhantomResult, func(o *Observed) {
			r := o.Results[2]
			r.ToolUseID = "tu_other"
			o.Results = append(o.Results, r)
		}},
		{"a result with another call's key", VForeignResult, func(o *Observed) { o.Results[2].Key = keyOf(o, "tu_pay") }},
		{"a second payment for one key", VDuplicateEffect, func(o *Observed) {
			o.Payments = append(o.Payments, sandbox.Payment{ID: "pay_000002", IdempotencyKey: keyOf(o, "tu_pay"), Request: o.Published["tu_pay"].Job.Args})
		}},
		{"a second ticket for one key", VDuplicateEffect, func(o *Observed) {
			o.Tickets = append(o.Tickets, sandbox.Ticket{ID: "tkt_000002", IdempotencyKey: keyOf(o, "tu_tkt"), Request: o.Published["tu_tkt"].Job.Args})
		}},
		{"an ok payment the sandbox never made", VMissingEffect, func(o *Observed) { o.Payments = nil }},
		{"an ok result with another payment's output", VOutputMismatch, func(o *Observed) { o.Results[0].Output = json.RawMessage(`{"id":"pay_000009"}`) }},
		{"a ledger row with another payment's output", VForeignOutput, func(o *Observed) {
			k := keyOf(o, "tu_pay")
			row := o.Rows[k]
			row.Result = json.RawMessage(`{"id":"pay_000009"}`)
			o.Rows[k] = row
			o.Results[0].Output = row.Result
		}},
		{"a read answering another query", VForeignOutput, func(o *Observed) { o.Results[2].Output = json.RawMessage(`{"query":"inv-c2-"}`) }},
		{"a result of a superseded attempt", VStaleAttempt, func(o *Observed) { o.Results[0].Attempts = 1 }},
		{"a result the ledger contradicts", VStatusMismatch, func(o *Observed) { o.Results[1].Status = jobs.StatusIndeterminate }},
		{"a result for a row in flight", VResultUnsettled, func(o *Observed) {
			k := keyOf(o, "tu_tkt")
			row := o.Rows[k]
			row.State = ledger.InFlight
			o.Rows[k] = row
		}},
		{"a ticket made while the ledger released the call", VSilentUncertain, func(o *Observed) {
			delete(o.Rows, keyOf(o, "tu_tkt"))
			o.Results = slices.Delete(o.Results, 1, 2)
			o.DeadLetters = []operate.DeadLetter{{Reason: jobs.DLQMaxDeliver, ToolUseID: "tu_tkt"}}
		}},
		{"an indeterminate ticket that was made", "", func(o *Observed) {
			k := keyOf(o, "tu_tkt")
			o.Rows[k] = ledger.Row{Key: k, State: ledger.Indeterminate, Attempt: 2, FirstToolUseID: "tu_tkt"}
			o.Results[1].Status, o.Results[1].Output, o.Results[1].Attempts = jobs.StatusIndeterminate, nil, 2
		}},
		{"an indeterminate ticket whose request arrived within the tolerance", "", func(o *Observed) {
			k := keyOf(o, "tu_tkt")
			settled := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
			o.Rows[k] = ledger.Row{Key: k, State: ledger.Indeterminate, Attempt: 2, FirstToolUseID: "tu_tkt", UpdatedAt: settled}
			o.Results[1].Status, o.Results[1].Output, o.Results[1].Attempts = jobs.StatusIndeterminate, nil, 2
			o.Tickets[0].ReceivedAt = settled.Add(lapseTolerance / 2)
		}},
		{"a ticket sent long after its row was settled indeterminate", VLapsedClaimSend, func(o *Observed) {
			k := keyOf(o, "tu_tkt")
			settled := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
			o.Rows[k] = ledger.Row{Key: k, State: ledger.Indeterminate, Attempt: 2, FirstToolUseID: "tu_tkt", UpdatedAt: settled}
			o.Results[1].Status, o.Results[1].Output, o.Results[1].Attempts = jobs.StatusIndeterminate, nil, 2
			o.Tickets[0].ReceivedAt = settled.Add(lapseTolerance + time.Second)
		}},
		{"an effect with a key nobody published", VPhantomEffect, func(o *Observed) {
			o.Tickets = append(o.Tickets, sandbox.Ticket{ID: "tkt_000002", IdempotencyKey: "0123456789abcdef0123456789abcdef"})
		}},
		{"a payment made with another call's body", VForeignEffect, func(o *Observed) {
			o.Payments[0].Request = json.RawMessage(`{"invoice_id":"inv-c9-1","amount_cents":500,"currency":"EUR"}`)
		}},
		{"a rejected valid job", VRejected, func(o *Observed) { o.Results[2].Status = jobs.StatusRejected }},
		{"a definite failure that took effect", VEffectOfFailure, func(o *Observed) {
			k := keyOf(o, "tu_pay")
			row := o.Rows[k]
			row.State = ledger.Failed
			o.Rows[k] = row
			o.Results[0].Status, o.Results[0].Output = jobs.StatusError, nil
		}},
		{"a ledger row claimed by another call's job", VForeignRow, func(o *Observed) {
			k := keyOf(o, "tu_pay")
			row := o.Rows[k]
			row.FirstToolUseID = "tu_tkt"
			o.Rows[k] = row
		}},
		{"a write result without a ledger row", VResultNoRow, func(o *Observed) {
			delete(o.Rows, keyOf(o, "tu_pay"))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := checkFixture(t)
			tc.mutate(&o)
			_, vs := Check(o)
			var kinds []string
			for _, v := range vs {
				kinds = append(kinds, v.Kind)
			}
			if tc.want == "" && len(vs) > 0 {
				t.Fatalf("violations %v in a consistent run", vs)
			}
			if tc.want != "" && !slices.Contains(kinds, tc.want) {
				t.Fatalf("want a %s violation, got %v", tc.want, vs)
			}
		})
	}
}
