package soak

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/jcs"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
	"github.com/toolq/toolq/tools"
)

// Published is one tool_use_id the driver published, with the key it
// derived and the class of its tool.
type Published struct {
	Job   jobs.Job
	Key   string
	Class tools.Class
	Route string // original or retried_turn: how this tool_use_id came to be
}

// Observed is everything the checker reads at the end of a run.
type Observed struct {
	Published   map[string]*Published // by tool_use_id
	Results     []jobs.Result         // every message of TOOLQ_RESULTS
	DeadLetters []operate.DeadLetter  // every message of TOOLQ_DLQ
	Rows        map[string]ledger.Row // the ledger, by key
	Payments    []sandbox.Payment     // every effect the sandbox recorded
	Tickets     []sandbox.Ticket
}

// Violation is one broken promise, with what the checker saw.
type Violation struct {
	Kind   string
	Detail string
}

func (v Violation) String() string { return v.Kind + ": " + v.Detail }

// The kinds of violation.
const (
	VLost            = "lost"                 // a tool_use_id with neither a result nor a dead letter
	VPhantomResult   = "phantom_result"       // a result for a tool_use_id nobody published
	VForeignResult   = "foreign_result"       // a result whose key or call is not its job's
	VRejected        = "rejected"             // a valid job was rejected
	VResultNoRow     = "result_without_row"   // a write's result with no ledger row
	VResultUnsettled = "result_unsettled"     // a result for a row still in flight
	VStatusMismatch  = "status_mismatch"      // a result disagrees with the ledger's state
	VStaleAttempt    = "stale_attempt"        // a result of a superseded attempt: a fenced write got through
	VOutputMismatch  = "output_mismatch"      // a result's output is not the ledger's
	VDuplicateEffect = "duplicate_effect"     // more than one effect for one key
	VMissingEffect   = "missing_effect"       // an ok result and no effect
	VForeignOutput   = "foreign_output"       // an ok result carries another call's output
	VForeignEffect   = "foreign_effect"       // an effect whose request is not its key's call
	VPhantomEffect   = "phantom_effect"       // an effect with a key no published job has
	VSilentUncertain = "silent_uncertain"     // an unkeyed effect happened, the ledger neither completed nor indeterminate
	VEffectOfFailure = "effect_of_failure"    // a definite failure whose effect happened
	VForeignRow      = "foreign_row"          // a ledger row of no published call, or claimed by another call's tool_use_id
	VLapsedClaimSend = "sent_on_lapsed_claim" // an unkeyed write reached the sandbox long after another delivery settled its row
)

// lapseTolerance is how much later than the settling of its row an unkeyed
// write's request may still arrive at the sandbox and have been sent while
// its claim was held: longer than any fault holds a request between a
// consumer and the sandbox (a black hole of at most 2.5 s, 300 ms of added
// latency) and than a zombie stays stopped (ackWait + lease/2 + 1 s). A
// request that arrives later was sent after its claim had lapsed: the
// delivery that settled the row (indeterminate, its holder lost) never
// sends, so only a holder that no longer held the claim can have.
const lapseTolerance = 8 * time.Second

// Figures are what the checker counted.
type Figures struct {
	ToolUseIDs, Keys    int
	Results             int
	ResultsByStatus     map[jobs.Status]int
	DuplicateResults    int // results answered from the ledger for another tool_use_id
	RepeatedResults     int // more than one result message for one tool_use_id
	DeadLetters         map[string]int
	DeadLetteredIDs     int
	LedgerByState       map[ledger.State]int
	Payments, Tickets   int
	KeyedOK             int // keyed_write keys whose result is ok: each has exactly one payment
	UnkeyedOK           int // unkeyed_write keys completed with their one ticket
	Indeterminate       int // unkeyed_write keys left indeterminate
	IndeterminateEffect int // of which the sandbox did apply the effect
	TakenOver           int // keys whose final attempt is above 1
	Lost                int
	SilentDuplicates    int
}

// Check compares what was published with what toolq and the sandbox
// recorded and returns the figures and every violation.
func Check(o Observed) (Figures, []Violation) {
	f := Figures{ResultsByStatus: map[jobs.Status]int{}, DeadLetters: map[string]int{}, LedgerByState: map[ledger.State]int{}}
	var vs []Violation
	add := func(kind, format string, args ...any) {
		vs = append(vs, Violation{Kind: kind, Detail: fmt.Sprintf(format, args...)})
	}

	byKey := map[string][]*Published{}
	for _, p := range o.Published {
		byKey[p.Key] = append(byKey[p.Key], p)
	}
	f.ToolUseIDs, f.Keys = len(o.Published), len(byKey)
	for key, r := range sorted(o.Rows) {
		f.LedgerByState[r.State]++
		if r.Attempt > 1 {
			f.TakenOver++
		}
		if first := o.Published[r.FirstToolUseID]; len(byKey[key]) == 0 || first == nil || first.Key != key {
			add(VForeignRow, "ledger row %s (%s, attempt %d) was claimed by %q, which is not a published job of that key", key, r.State, r.Attempt, r.FirstToolUseID)
		}
	}

	// Every result belongs to a published job and describes it.
	resultsByID := map[string][]jobs.Result{}
	resultsByKey := map[string][]jobs.Result{}
	for _, r := range o.Results {
		f.Results++
		f.ResultsByStatus[r.Status]++
		if r.Duplicate {
			f.DuplicateResults++
		}
		p := o.Published[r.ToolUseID]
		if p == nil {
			add(VPhantomResult, "result for tool_use_id %s (key %s), which was never published", r.ToolUseID, r.Key)
			continue
		}
		j := p.Job
		if r.Key != p.Key || r.ConversationID != j.ConversationID || r.TurnIndex != j.TurnIndex || r.Ordinal != j.Ordinal || r.Tool != j.Tool {
			add(VForeignResult, "result for %s says key %s call %s/%d/%s/%d, the job is key %s call %s/%d/%s/%d",
				r.ToolUseID, r.Key, r.ConversationID, r.TurnIndex, r.Tool, r.Ordinal, p.Key, j.ConversationID, j.TurnIndex, j.Tool, j.Ordinal)
			continue
		}
		if r.Status == jobs.StatusRejected {
			add(VRejected, "valid job %s (key %s) rejected: %s", r.ToolUseID, r.Key, errText(r.Error))
			continue
		}
		if len(resultsByID[r.ToolUseID]) > 0 {
			f.RepeatedResults++
		}
		resultsByID[r.ToolUseID] = append(resultsByID[r.ToolUseID], r)
		resultsByKey[r.Key] = append(resultsByKey[r.Key], r)
	}

	// Every published tool_use_id has a result or a dead letter.
	dead := map[string]bool{}
	for _, d := range o.DeadLetters {
		f.DeadLetters[d.Reason]++
		dead[d.ToolUseID] = true
	}
	for id, p := range sorted(o.Published) {
		if dead[id] {
			f.DeadLetteredIDs++
		}
		if len(resultsByID[id]) == 0 && !dead[id] {
			f.Lost++
			add(VLost, "%s (%s, key %s, %s) has no result and no dead letter; ledger: %s", id, p.Job.Tool, p.Key, p.Route, rowText(o.Rows, p.Key))
		}
	}

	// Writes: every result agrees with the final ledger row, which no
	// superseded attempt changed.
	for key, rs := range sorted(resultsByKey) {
		p := byKey[key][0]
		if p.Class == tools.Read {
			for _, r := range rs {
				if r.Status == jobs.StatusOK && !readAnswers(r.Output, p.Job.Args) {
					add(VForeignOutput, "read %s (key %s) answered %s for args %s", r.ToolUseID, key, r.Output, p.Job.Args)
				}
			}
			continue
		}
		row, ok := o.Rows[key]
		if !ok {
			add(VResultNoRow, "key %s has %d result(s) (first %s %s) and no ledger row", key, len(rs), rs[0].ToolUseID, rs[0].Status)
			continue
		}
		want, settled := statusOf(row.State)
		for _, r := range rs {
			switch {
			case !settled:
				add(VResultUnsettled, "%s got %s for key %s, whose row is still %s (attempt %d)", r.ToolUseID, r.Status, key, row.State, row.Attempt)
			case r.Status != want:
				add(VStatusMismatch, "%s got %s for key %s, the ledger says %s", r.ToolUseID, r.Status, key, row.State)
			case int64(r.Attempts) != row.Attempt:
				add(VStaleAttempt, "%s got a result of attempt %d for key %s, whose row is attempt %d (%s, owner %s)", r.ToolUseID, r.Attempts, key, row.Attempt, row.State, row.Owner)
			case r.Status == jobs.StatusOK && !sameJSON(r.Output, row.Result):
				add(VOutputMismatch, "%s got %s for key %s, the ledger holds %s", r.ToolUseID, r.Output, key, row.Result)
			}
		}
	}

	// Effects at the sandbox, by the key they carried.
	payments := map[string][]sandbox.Payment{}
	for _, p := range o.Payments {
		payments[p.IdempotencyKey] = append(payments[p.IdempotencyKey], p)
	}
	tickets := map[string][]sandbox.Ticket{}
	for _, t := range o.Tickets {
		tickets[t.IdempotencyKey] = append(tickets[t.IdempotencyKey], t)
	}
	f.Payments, f.Tickets = len(o.Payments), len(o.Tickets)
	for key, ps := range sorted(payments) {
		if pubs := byKey[key]; len(pubs) == 0 || pubs[0].Class != tools.KeyedWrite {
			add(VPhantomEffect, "%d payment(s) (first %s) carry key %q, which no published send_payment has", len(ps), ps[0].ID, key)
		}
	}
	for key, ts := range sorted(tickets) {
		if pubs := byKey[key]; len(pubs) == 0 || pubs[0].Class != tools.UnkeyedWrite {
			add(VPhantomEffect, "%d ticket(s) (first %s) carry key %q, which no published create_ticket has", len(ts), ts[0].ID, key)
		}
	}

	for key, pubs := range sorted(byKey) {
		p := pubs[0]
		row, hasRow := o.Rows[key]
		switch p.Class {
		case tools.KeyedWrite:
			ps := payments[key]
			if len(ps) > 1 {
				add(VDuplicateEffect, "key %s (%s) has %d payments: %s", key, p.Job.ToolUseID, len(ps), paymentIDs(ps))
			}
			for _, pay := range ps {
				if !sameJSON(pay.Request, p.Job.Args) {
					add(VForeignEffect, "payment %s for key %s was made with %s, the call is %s", pay.ID, key, pay.Request, p.Job.Args)
				}
			}
			if !hasRow {
				continue
			}
			switch row.State {
			case ledger.Completed:
				f.KeyedOK++
				if len(ps) == 0 {
					add(VMissingEffect, "key %s completed with %s, and the sandbox made no payment for it", key, row.Result)
				} else if id := outputID(row.Result); id != ps[0].ID {
					add(VForeignOutput, "key %s completed with payment %q, the sandbox made %s for it", key, id, ps[0].ID)
				}
			case ledger.Failed:
				if len(ps) > 0 {
					add(VEffectOfFailure, "key %s failed (%s), and the sandbox made payment %s for it", key, errInfo(row.Error), ps[0].ID)
				}
			}
		case tools.UnkeyedWrite:
			ts := tickets[key]
			if len(ts) > 1 {
				f.SilentDuplicates++
				add(VDuplicateEffect, "key %s (%s) has %d tickets: %s", key, p.Job.ToolUseID, len(ts), ticketIDs(ts))
			}
			for _, t := range ts {
				if !sameJSON(t.Request, p.Job.Args) {
					add(VForeignEffect, "ticket %s for key %s was made with %s, the call is %s", t.ID, key, t.Request, p.Job.Args)
				}
			}
			state := ledger.State("absent")
			if hasRow {
				state = row.State
			}
			switch {
			case state == ledger.Indeterminate:
				f.Indeterminate++
				if len(ts) > 0 {
					f.IndeterminateEffect++
				}
				for _, t := range ts {
					if late := t.ReceivedAt.Sub(row.UpdatedAt); late > lapseTolerance {
						add(VLapsedClaimSend, "key %s (%s): ticket %s arrived %v after the row was settled %s (%s): sent on a claim no longer held",
							key, p.Job.Tool, t.ID, late.Round(time.Millisecond), state, errInfo(row.Error))
					}
				}
			case state == ledger.Completed:
				f.UnkeyedOK++
				if len(ts) == 0 {
					add(VMissingEffect, "key %s completed with %s, and the sandbox has no ticket for it", key, row.Result)
				} else if id := outputID(row.Result); id != ts[0].ID {
					add(VForeignOutput, "key %s completed with ticket %q, the sandbox made %s for it", key, id, ts[0].ID)
				}
			case len(ts) > 0:
				f.SilentDuplicates++
				add(VSilentUncertain, "key %s: the sandbox made ticket %s, and the ledger row is %s, not completed or indeterminate (%s)", key, ts[0].ID, state, rowText(o.Rows, key))
			}
		}
	}
	return f, vs
}

// statusOf is the result status a settled ledger state answers with.
func statusOf(s ledger.State) (jobs.Status, bool) {
	switch s {
	case ledger.Completed:
		return jobs.StatusOK, true
	case ledger.Failed:
		return jobs.StatusError, true
	case ledger.Indeterminate:
		return jobs.StatusIndeterminate, true
	}
	return "", false
}

// sameJSON compares two JSON documents by their canonical form.
func sameJSON(a, b []byte) bool {
	ca, errA := jcs.Canonicalize(a)
	cb, errB := jcs.Canonicalize(b)
	if errA != nil || errB != nil {
		return bytes.Equal(a, b)
	}
	return bytes.Equal(ca, cb)
}

func outputID(out json.RawMessage) string {
	var v struct {
		ID string `json:"id"`
	}
	json.Unmarshal(out, &v)
	return v.ID
}

// readAnswers reports whether a search_orders output answers the query in
// args.
func readAnswers(out, args json.RawMessage) bool {
	var o, a struct {
		Query string `json:"query"`
	}
	return json.Unmarshal(out, &o) == nil && json.Unmarshal(args, &a) == nil && o.Query == a.Query
}

func rowText(rows map[string]ledger.Row, key string) string {
	r, ok := rows[key]
	if !ok {
		return "no row"
	}
	return fmt.Sprintf("%s attempt %d owner %s error %s", r.State, r.Attempt, r.Owner, errInfo(r.Error))
}

func errInfo(e *ledger.ErrorInfo) string {
	if e == nil {
		return "-"
	}
	return e.Code + " " + e.Message
}

func errText(e *jobs.ResultError) string {
	if e == nil {
		return "-"
	}
	return e.Code + " " + e.Message
}

func paymentIDs(ps []sandbox.Payment) string {
	var ids []string
	for _, p := range ps {
		ids = append(ids, p.ID)
	}
	return strings.Join(ids, ",")
}

func ticketIDs(ts []sandbox.Ticket) string {
	var ids []string
	for _, t := range ts {
		ids = append(ids, t.ID)
	}
	return strings.Join(ids, ",")
}

// sorted iterates a map in key order, so that violations are reported in a
// stable order.
func sorted[V any](m map[string]V) func(func(string, V) bool) {
	return func(yield func(string, V) bool) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !yield(k, m[k]) {
				return
			}
		}
	}
}
