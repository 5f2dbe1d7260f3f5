// Package pull reads a JetStream pull iterator (jetstream.MessagesContext)
// without the stall it can fall into on its own.
//
// The iterator asks the server for more messages only from inside Next, at
// the top of each wait, and only while no earlier request is still being
// sent. When the caller takes the last buffered message while that earlier
// request is in the middle of being sent, the check is skipped and Next
// then waits for messages nobody asked for: nothing arrives until the
// iterator's missed-heartbeat timer (twice the heartbeat, half the pull
// expiry) resets its accounting. Under load on a busy machine this was
// seen as the server holding no pull request for the consumer, nothing
// pending acknowledgement and thousands of messages waiting, for exactly
// that timer's length.
//
// Iter waits in short slices while messages flow, so that the check runs
// again within Recheck, and waits in one piece (the heartbeat watched)
// once the stream has been quiet for Quiet and the connection is up. While
// it is down Iter keeps to slices: the iterator's notice of the disconnect
// (which stops its heartbeat timer) is taken by whichever wait is running,
// and a wait in one piece begun after a slice took it would report missed
// heartbeats all through the outage, each one queueing another pull request
// for the reconnect, whose answers the iterator's buffer cannot hold.
package pull

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/toolq/toolq/internal/jsretry"
)

const (
	// Recheck is the longest a wait lasts while messages flow.
	Recheck = 50 * time.Millisecond
	// Quiet is how long without a message before Next waits in one piece,
	// with the iterator's heartbeat check, instead of in slices.
	Quiet = time.Second
)

// Iter wraps a pull iterator. Like the iterator, it is for one reader.
type Iter struct {
	it   jetstream.MessagesContext
	nc   *nats.Conn
	last time.Time // when the last message came (or the Iter was made)
}

// New wraps it, an iterator on nc (nil: none to watch, taken as up).
func New(it jetstream.MessagesContext, nc *nats.Conn) *Iter {
	return &Iter{it: it, nc: nc, last: time.Now()}
}

// Next returns the next message, or the iterator's error: as
// MessagesContext.Next, without its stall. Every call begins with a slice,
// so that a message already buffered comes out at once even while a
// reconnect attempt holds the connection (IsConnected waits for it).
func (p *Iter) Next() (jetstream.Msg, error) {
	for {
		msg, err := p.it.Next(jetstream.NextMaxWait(Recheck))
		if errors.Is(err, nats.ErrTimeout) {
			if time.Since(p.last) <= Quiet || (p.nc != nil && !p.nc.IsConnected()) {
				continue
			}
			msg, err = p.it.Next()
		}
		if err == nil {
			p.last = time.Now()
		}
		return msg, err
	}
}

// Stop stops the iterator (MessagesContext.Stop).
func (p *Iter) Stop() { p.it.Stop() }

// Drain drains the iterator (MessagesContext.Drain): Next returns what was
// buffered, then jetstream.ErrMsgIteratorClosed.
func (p *Iter) Drain() { p.it.Drain() }

// OrderedConsumer creates an ordered consumer on stream as
// js.OrderedConsumer does, and asks again whenever a request goes
// unanswered (jsretry.Do), until ctx ends. In a cluster that has just lost
// a node (its leader of the stream, or of the cluster's metadata) a create
// request can go unanswered, and js.OrderedConsumer waits for it until ctx
// ends: an agent awaiting its results with a deadline of minutes waited
// that long for nothing, though every result was there. Each request names
// a consumer of its own: the cluster places a consumer on a server when it
// is first asked for, and the same name asked again goes to that server,
// which may be the one that just died. The consumers of the requests whose
// answers were lost are deleted (all of them when none was answered: ones
// asked while the server was down reach it when it is back). Without a deadline
// on ctx it asks once, and JetStream's own timeout ends the wait, as before.
func OrderedConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	prefix := cfg.NamePrefix
	if prefix == "" {
		prefix = nuid.Next()
	}
	var asked []string // the name prefixes asked for, in order
	cons, err := jsretry.Do(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
		cfg.NamePrefix = fmt.Sprintf("%s_%d", prefix, len(asked))
		asked = append(asked, cfg.NamePrefix)
		return js.OrderedConsumer(ctx, stream, cfg)
	})
	if err == nil {
		asked = asked[:len(asked)-1]
	}
	deleteUnanswered(js, stream, asked)
	return cons, err
}

// deleteUnanswered deletes, best effort and without waiting, the consumers
// that the creates of the name prefixes may have made though their answers
// were lost (an ordered consumer's first is <prefix>_1). Each delete is
// sent at once: on a connection that is down it waits in the reconnect
// buffer behind the create it undoes. One left is removed by the server
// once idle.
func deleteUnanswered(js jetstream.JetStream, stream string, prefixes []string) {
	for _, p := range prefixes {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), jsretry.Patience())
			defer cancel()
			js.DeleteConsumer(ctx, stream, p+"_1")
		}()
	}
}
