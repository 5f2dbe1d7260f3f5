package testenv

import (
	"crypto/rand"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LossyJetStream is a JetStream whose API requests go through a relay on
// a subject prefix of its own (RELAY.<id>.API): each is passed on to the
// server's API, and the server answers the asker directly, unless the
// relay's lose says to lose the answer: then the request still reaches the
// server (a consumer it asks for is created; a pull's batch is delivered,
// and counted delivered) and its answer goes to a listener that drops it,
// as when a cluster's lost node eats it.
type LossyJetStream struct {
	jetstream.JetStream                     // the relayed API
	Direct              jetstream.JetStream // the server's API, not relayed

	mu        sync.Mutex
	asked     []string         // API subjects relayed, in order
	onRequest func(api string) // called with each request's API subject before it is passed on
}

// OnRequest has f called with the API subject (after $JS.API.) of each
// request the relay passes on, before it does.
func (r *LossyJetStream) OnRequest(f func(api string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onRequest = f
}

// LoseJetStreamAnswers relays the JetStream API requests of a JetStream on
// nc. lose is told each request's kind (CONSUMER.CREATE, STREAM.INFO, the
// API subject's first two tokens) and how many of that kind came before it,
// plus one.
func LoseJetStreamAnswers(t testing.TB, nc *nats.Conn, lose func(api string, nth int) bool, opts ...jetstream.JetStreamOpt) *LossyJetStream {
	t.Helper()
	r := &LossyJetStream{}
	counts := map[string]int{}
	id := rand.Text()
	prefix := "RELAY." + id + ".API"
	// The server delivers a pull's batch only to a reply someone listens
	// on: the lost answers go here.
	sink, err := nc.Subscribe("LOST."+id+".>", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Unsubscribe() })
	sub, err := nc.Subscribe(prefix+".>", func(m *nats.Msg) {
		api := strings.TrimPrefix(m.Subject, prefix+".")
		kind := strings.Join(strings.SplitN(api, ".", 3)[:2], ".")
		r.mu.Lock()
		r.asked = append(r.asked, api)
		counts[kind]++
		nth := counts[kind]
		before := r.onRequest
		r.mu.Unlock()
		if before != nil {
			before(api)
		}
		fwd := &nats.Msg{Subject: "$JS.API." + api, Reply: m.Reply, Header: m.Header, Data: m.Data}
		if lose(kind, nth) {
			fwd.Reply = "LOST." + id + "." + nats.NewInbox()
		}
		nc.PublishMsg(fwd)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if r.JetStream, err = jetstream.NewWithAPIPrefix(nc, prefix, opts...); err != nil {
		t.Fatal(err)
	}
	if r.Direct, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return r
}

// Asked counts the API requests relayed whose subject (after $JS.API.)
// starts with prefix.
func (r *LossyJetStream) Asked(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, a := range r.asked {
		if strings.HasPrefix(a, prefix) {
			n++
		}
	}
	return n
}
