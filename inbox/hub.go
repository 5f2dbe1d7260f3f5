package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// change tells the pages that the calls they show changed: an approval
// event of the stream (requested, approved, denied, expired; Group is the
// call's), or "changed" when the ledger's poll saw something the stream
// did not say (Group empty: every page looks).
type change struct {
	Event string `json:"event"`
	Key   string `json:"key,omitempty"`
	Group string `json:"-"`
}

// hub tells the pages' event streams what changed. The approvals stream's
// events (a core subscription on toolq.approvals.>) say it at once; the
// ledger, polled while a page is open, says what they cannot: a decision
// recorded by a CLI without NATS, an event that was lost.
type hub struct {
	mu   sync.Mutex
	subs map[chan change][]string // the groups each page shows
	last map[string]string        // each group's fingerprint at the last poll
}

func (h *hub) subscribe(groups []string) chan change {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan change, 16)
	h.subs[ch] = groups
	return ch
}

func (h *hub) unsubscribe(ch chan change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, ch)
}

// watched returns the groups the open pages show.
func (h *hub) watched() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var groups []string
	for _, gs := range h.subs {
		for _, g := range gs {
			if !slices.Contains(groups, g) {
				groups = append(groups, g)
			}
		}
	}
	slices.Sort(groups)
	return groups
}

// publish tells every page; a page that is behind gets it later or not at
// all, and refreshes on the next.
func (h *hub) publish(c change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- c:
		default:
		}
	}
}

// event is the handler of the approvals stream's messages.
func (h *hub) event(msg *nats.Msg) {
	var ev jobs.ApprovalEvent
	if json.Unmarshal(msg.Data, &ev) != nil || ev.Key == "" {
		return
	}
	h.publish(change{Event: ev.Event, Key: ev.Key, Group: ev.Group})
}

// recentDecisions is how many of a group's latest decisions a poll
// compares: a new decision changes the group's pending calls, and what
// changes after a decision (the approved call runs) comes soon after it.
const recentDecisions = 20

// poll compares, for each group an open page shows, the calls awaiting
// its approval that a page lists (the first limit to expire, and how many
// there are) and its latest decisions with the last poll's, and tells the
// group's pages when they changed. A page of several groups lists the
// first of their calls together, each of which is among the first of its
// own group: a change of its list is a change of some group's.
func (h *hub) poll(ctx context.Context, store *ledger.Store, limit int) error {
	groups := h.watched()
	seen := map[string]string{}
	for _, g := range groups {
		fp, err := fingerprint(ctx, store, g, limit)
		if err != nil {
			return err
		}
		seen[g] = fp
	}
	h.mu.Lock()
	var changed []string
	for _, g := range groups {
		if h.last[g] != seen[g] {
			changed = append(changed, g)
		}
	}
	h.last = seen
	h.mu.Unlock()
	for _, g := range changed {
		h.publish(change{Event: "changed", Group: g})
	}
	return nil
}

// fingerprint is what the pages of group list of it, in short.
func fingerprint(ctx context.Context, store *ledger.Store, group string, limit int) (string, error) {
	awaiting := ledger.Filter{State: ledger.AwaitingApproval, Groups: []string{group}, Order: ledger.OldestExpiryFirst, Limit: limit}
	pending, err := store.List(ctx, awaiting)
	if err != nil {
		return "", err
	}
	total, err := store.Total(ctx, awaiting)
	if err != nil {
		return "", err
	}
	decided, err := store.List(ctx, ledger.Filter{Approval: "decided", Groups: []string{group}, Order: ledger.LatestDecisionFirst,
		Limit: recentDecisions})
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d", total)
	for _, r := range slices.Concat(pending, decided) {
		fmt.Fprintf(&b, ",%s:%s:%s:%d", r.Key, r.State, r.ApprovalStatus, len(r.Waiters))
	}
	return b.String(), nil
}

// run polls the ledger every interval while a page is open, until ctx ends.
func (h *hub) run(ctx context.Context, store *ledger.Store, interval time.Duration, limit int, failed func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := h.poll(ctx, store, limit); err != nil && ctx.Err() == nil {
			failed(err)
		}
	}
}
