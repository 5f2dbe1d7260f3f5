package soak

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
)

// The tools of the soak registry, one per class.
const (
	toolPayment = "send_payment"  // keyed_write: POST /v1/payments honours Idempotency-Key
	toolTicket  = "create_ticket" // unkeyed_write: POST /v1/tickets has no dedupe
	toolSearch  = "search_orders" // read: GET /v1/orders
	// toolQueued is an unkeyed write with one concurrency slot and a
	// downstream slow next to its timeout, published in bursts far above its
	// slot: its calls wait for their slot longer than the timeout, the grace
	// and the lease together (the scheduling space, not a fault).
	toolQueued = "file_report"
)

var classOf = map[string]tools.Class{toolPayment: tools.KeyedWrite, toolTicket: tools.UnkeyedWrite, toolSearch: tools.Read, toolQueued: tools.UnkeyedWrite}

// The bursts of toolQueued: a burst of queuedBurst calls every 1,000 calls
// of the plan (one in the middle of a shorter one). Each call takes 1.5 s
// at the sandbox (Sandbox-Latency-Ms, against a 2 s timeout) at its tool's
// one slot, and a consumer holds up to 16 jobs: the last of a consumer's
// 16 waits about 22 s for its slot, past the 3 s give-up, the 4 s lease,
// the ack wait, and the checker's lapseTolerance after them.
const queuedBurst = 60

// registryYAML is the consumers' registry: short timeouts and leases so that
// zombies and takeovers happen within a run.
const registryYAML = `tools:
  - name: send_payment
    class: keyed_write
    timeout: 1s
    lease: 2s
    breaker: {failures: 20, open_for: 1s}
    schema:
      type: object
      additionalProperties: false
      required: [invoice_id, amount_cents, currency]
      properties:
        invoice_id: {type: string, maxLength: 64}
        amount_cents: {type: integer, minimum: 1}
        currency: {type: string, pattern: "^[A-Z]{3}$"}
    http: {method: POST, url: "${TOOLQ_SANDBOX_URL}/v1/payments"}
  - name: create_ticket
    class: unkeyed_write
    timeout: 1s
    lease: 2s
    breaker: {failures: 20, open_for: 1s}
    schema:
      type: object
      additionalProperties: false
      required: [title, body]
      properties:
        title: {type: string}
        body: {type: string}
    http: {method: POST, url: "${TOOLQ_SANDBOX_URL}/v1/tickets"}
  - name: search_orders
    class: read
    timeout: 1s
    breaker: {failures: 20, open_for: 1s}
    schema:
      type: object
      additionalProperties: false
      required: [query]
      properties:
        query: {type: string}
    http: {method: GET, url: "${TOOLQ_SANDBOX_URL}/v1/orders"}
  - name: file_report
    class: unkeyed_write
    timeout: 2s
    lease: 4s
    concurrency: 1
    breaker: {failures: 20, open_for: 1s}
    schema:
      type: object
      additionalProperties: false
      required: [title, body]
      properties:
        title: {type: string}
        body: {type: string}
    http: {method: POST, url: "${TOOLQ_SANDBOX_URL}/v1/tickets", headers: {Sandbox-Latency-Ms: "1500"}}
`

// registryFor is registryYAML with the tools reached by executor: http
// (the sandbox's HTTP API) or mcp (the same effects through the sandbox's
// MCP server, over Streamable HTTP: every fault of the soak then runs for
// the MCP executor).
func registryFor(executor string) (string, error) {
	switch executor {
	case "http":
		return registryYAML, nil
	case "mcp":
	default:
		return "", fmt.Errorf("soak.executor %q: want http or mcp", executor)
	}
	reg := registryYAML
	for _, r := range []struct{ http, mcp string }{
		{`http: {method: POST, url: "${TOOLQ_SANDBOX_URL}/v1/payments"}`, `mcp: {url: "${TOOLQ_SANDBOX_URL}/mcp", tool: send_payment}`},
		{`http: {method: POST, url: "${TOOLQ_SANDBOX_URL}/v1/tickets"}`, `mcp: {url: "${TOOLQ_SANDBOX_URL}/mcp", tool: create_ticket}`},
		{`http: {method: GET, url: "${TOOLQ_SANDBOX_URL}/v1/orders"}`, `mcp: {url: "${TOOLQ_SANDBOX_URL}/mcp", tool: search_orders}`},
		{`http: {method: POST, url: "${TOOLQ_SANDBOX_URL}/v1/tickets", headers: {Sandbox-Latency-Ms: "1500"}}`,
			`mcp: {url: "${TOOLQ_SANDBOX_URL}/mcp", tool: create_ticket, headers: {Sandbox-Latency-Ms: "1500"}}`},
	} {
		if !strings.Contains(reg, r.http) {
			return "", fmt.Errorf("registryYAML has no %s", r.http)
		}
		reg = strings.Replace(reg, r.http, r.mcp, 1)
	}
	return reg, nil
}

// The routes by which a job is published.
const (
	routeOriginal    = "original"     // the first publication of a call
	routeRetriedTurn = "retried_turn" // the same call, a new tool_use_id (args reordered, numbers respelled)
	routeExact       = "exact_repub"  // the same job again, same tool_use_id: JetStream drops it by Nats-Msg-Id
	routeReplay      = "replay"       // operate.Replay of the last stream sequences
)

// event is one step of the driver.
type event struct {
	route string
	job   jobs.Job // not for replays
	of    int      // exact_repub: the index of the event it repeats
	burst bool     // published at once after the event before it
}

// plan is what the driver publishes, in order; it depends on the seed only.
func plan(seed uint64, n int) []event {
	rng := rand.New(rand.NewPCG(seed, 0x5041))
	convs := max(1, n/6)
	turns := make([]int64, convs)
	var evs []event
	// Duplicates are placed a few events after what they repeat, so that
	// some arrive while the first attempt runs and some after it settled.
	type later struct {
		at int
		ev event
	}
	var pending []later
	id := 0
	nextID := func() string { id++; return fmt.Sprintf("tu_%d_%06d", seed, id) }
	for i := 0; i < n; i++ {
		c := rng.IntN(convs)
		turns[c]++
		conv := fmt.Sprintf("soak%d-c%04d", seed, c)
		var tool string
		switch r := rng.Float64(); {
		case r < 0.4:
			tool = toolPayment
		case r < 0.7:
			tool = toolTicket
		default:
			tool = toolSearch
		}
		amount := 100 + rng.IntN(99900)
		words := rng.Uint64()
		j := jobs.Job{Version: jobs.Version, ConversationID: conv, TurnIndex: turns[c], Tool: tool, ToolUseID: nextID(),
			Args: argsOf(tool, conv, turns[c], amount, words, false)}
		evs = append(evs, event{route: routeOriginal, job: j})
		orig := len(evs) - 1
		if rng.Float64() < 0.12 {
			retry := j
			retry.ToolUseID = nextID()
			retry.Args = argsOf(tool, conv, turns[c], amount, words, true)
			pending = append(pending, later{at: i + rng.IntN(12), ev: event{route: routeRetriedTurn, job: retry}})
		}
		if rng.Float64() < 0.06 {
			pending = append(pending, later{at: i + rng.IntN(12), ev: event{route: routeExact, of: orig}})
		}
		if i%40 == 39 {
			pending = append(pending, later{at: i, ev: event{route: routeReplay}})
		}
		if i%1000 == 500 || (n < 1000 && i == n/2) {
			for range queuedBurst {
				c := rng.IntN(convs)
				turns[c]++
				conv := fmt.Sprintf("soak%d-c%04d", seed, c)
				evs = append(evs, event{route: routeOriginal, job: jobs.Job{Version: jobs.Version, ConversationID: conv, TurnIndex: turns[c],
					Tool: toolQueued, ToolUseID: nextID(), Args: argsOf(toolQueued, conv, turns[c], 0, rng.Uint64(), false)}, burst: true})
			}
		}
		sort.SliceStable(pending, func(a, b int) bool { return pending[a].at < pending[b].at })
		for len(pending) > 0 && pending[0].at <= i {
			evs = append(evs, pending[0].ev)
			pending = pending[1:]
		}
	}
	for _, p := range pending {
		evs = append(evs, p.ev)
	}
	return evs
}

// argsOf writes a call's args; respelled, as a retried turn's model might:
// members in another order, integers as 1500.0. The key is the same.
func argsOf(tool, conv string, turn int64, amount int, words uint64, respelled bool) json.RawMessage {
	var s string
	switch tool {
	case toolPayment:
		inv := fmt.Sprintf("inv-%s-%d", conv, turn)
		s = fmt.Sprintf(`{"invoice_id":%q,"amount_cents":%d,"currency":"EUR"}`, inv, amount)
		if respelled {
			s = fmt.Sprintf(`{"currency": "EUR", "amount_cents": %d.0, "invoice_id": %q}`, amount, inv)
		}
	case toolTicket, toolQueued:
		title, body := fmt.Sprintf("ticket %s/%d", conv, turn), fmt.Sprintf("words %x", words)
		s = fmt.Sprintf(`{"title":%q,"body":%q}`, title, body)
		if respelled {
			s = fmt.Sprintf(`{"body": %q, "title": %q}`, body, title)
		}
	default:
		s = fmt.Sprintf(`{"query":%q}`, fmt.Sprintf("inv-%s-", conv))
	}
	return json.RawMessage(s)
}

// The kinds of fault.
const (
	faultKill      = "consumer_sigkill"
	faultStop      = "consumer_sigstop" // a zombie: stopped past the ack wait and the lease, then continued
	faultNATS      = "nats_restart"
	faultPostgres  = "postgres_restart"
	faultCrash     = "postgres_crash" // every process killed at once: the WAL not yet written is lost
	faultDrop      = "sandbox_apply_then_drop"
	faultRedirect  = "sandbox_apply_then_redirect" // Post/Redirect/Get: 302 Found after the effect
	faultLatency   = "latency_"
	faultReset     = "reset_"
	faultBlackHole = "blackhole_"
)

var links = []string{"nats", "postgres", "sandbox"}

func faultKinds() []string {
	kinds := []string{faultKill, faultStop, faultNATS, faultPostgres, faultCrash, faultDrop, faultRedirect}
	for _, l := range links {
		kinds = append(kinds, faultLatency+l, faultReset+l, faultBlackHole+l)
	}
	return kinds
}

// fault is one scheduled fault.
type fault struct {
	kind   string
	at     time.Duration // from the start of the load
	dur    time.Duration // how long it lasts (down, stopped, holed, slowed)
	amount time.Duration // latency added
	rate   float64       // drop- or redirect-after-effect probability
	target int           // consumer index
}

// schedule draws perKind faults of each kind over window; it depends on the
// seed only. stopFor is how long a zombie stays stopped (past the ack wait
// and the lease).
func schedule(seed uint64, perKind int, window, stopFor time.Duration, consumers int) []fault {
	rng := rand.New(rand.NewPCG(seed, 0xFA17))
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond }
	var fs []fault
	for _, k := range faultKinds() {
		for range perKind {
			f := fault{kind: k, at: time.Duration(float64(window) * (0.03 + 0.87*rng.Float64())), target: rng.IntN(consumers)}
			switch {
			case k == faultKill:
				f.dur = ms(200, 1500) // until the restart
			case k == faultStop:
				f.dur = stopFor + ms(0, 1000)
			case k == faultNATS, k == faultPostgres, k == faultCrash:
				f.dur = ms(200, 1500)
			case k == faultDrop, k == faultRedirect:
				f.dur, f.rate = ms(1000, 3000), 0.3+0.4*rng.Float64()
			case len(k) > len(faultLatency) && k[:len(faultLatency)] == faultLatency:
				f.dur, f.amount = ms(1000, 2500), ms(20, 300)
			case len(k) > len(faultBlackHole) && k[:len(faultBlackHole)] == faultBlackHole:
				f.dur = ms(500, 2500)
			}
			fs = append(fs, f)
		}
	}
	sort.SliceStable(fs, func(a, b int) bool { return fs[a].at < fs[b].at })
	return fs
}
