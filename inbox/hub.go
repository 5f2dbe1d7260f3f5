package inbox

import (
	"context"
	"encoding/json"
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
	subs map[chan change]struct{}
	last string // the ledger's fingerprint at the last poll
}

func (h *hub) subscribe() chan change {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan change, 16)
	h.subs[ch] = struct{}{}
	return ch
}

func (h *hub) unsubscribe(ch chan change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, ch)
}

func (h *hub) watched() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs) > 0
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

// poll compares the ledger's calls awaiting approval and its latest
// decisions with the last poll's, and says when they changed.
func (h *hub) poll(ctx context.Context, store *ledger.Store) error {
	pending, err := store.List(ctx, ledger.Filter{State: ledger.AwaitingApproval, Limit: maxListed})
	if err != nil {
		return err
	}
	decided, err := store.List(ctx, ledger.Filter{Approval: "any", Limit: 20})
	if err != nil {
		return err
	}
	var parts []string
	for _, r := range slices.Concat(pending, decided) {
		parts = append(parts, r.Key+":"+string(r.State)+":"+string(r.ApprovalStatus))
	}
	slices.Sort(parts)
	fp := strings.Join(parts, ",")
	h.mu.Lock()
	changed := h.last != fp
	h.last = fp
	h.mu.Unlock()
	if changed {
		h.publish(change{Event: "changed"})
	}
	return nil
}

// run polls the ledger every interval while a page is open, until ctx ends.
func (h *hub) run(ctx context.Context, store *ledger.Store, interval time.Duration, failed func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !h.watched() {
			continue
		}
		if err := h.poll(ctx, store); err != nil && ctx.Err() == nil {
			failed(err)
		}
	}
}
