// Package soak is toolq's soak test, in the spirit of Jepsen's queue
// checker: a nats-server, a Postgres cluster, the sandbox and several
// consumer processes run as separate processes, with a TCP proxy of this
// package between the consumers and each of NATS, Postgres and the sandbox.
// A load driver publishes jobs of the three tool classes with duplicates by
// every route while faults are injected on a seeded schedule, and a checker
// then compares what was published, what the results stream, the dead-letter
// stream and the ledger say, and what the sandbox recorded.
//
// The test is TestSoak (soak_test.go); the short run is part of go test ./...,
// the full run is `make soak`.
package soak

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from its own address to a target, and
// misbehaves on command: it adds latency to every chunk it forwards, resets
// every open connection, or black-holes (accepts, reads, and forwards
// nothing until healed).
type Proxy struct {
	Name   string
	target string
	l      net.Listener

	mu      sync.Mutex
	latency time.Duration
	holed   chan struct{} // not nil while black-holed; closed by Heal
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// NewProxy listens on 127.0.0.1 on a free port and forwards to target
// (host:port).
func NewProxy(name, target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("soak: proxy %s: %w", name, err)
	}
	p := &Proxy{Name: name, target: target, l: l, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to instead of the target.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// SetLatency delays every chunk forwarded in either direction by d (0: none).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Reset closes every open connection with a TCP RST on both sides and
// returns how many sockets it closed. New connections are forwarded as
// before.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for c := range p.conns {
		rst(c)
		delete(p.conns, c)
	}
	return n
}

// BlackHole stops forwarding: open connections stay open but nothing they
// send arrives, and new connections are accepted and never reach the
// target, until Heal.
func (p *Proxy) BlackHole() {
	p.mu.Lock()
	if p.holed == nil {
		p.holed = make(chan struct{})
	}
	p.mu.Unlock()
}

// Heal ends a black hole and removes the latency: what was held back is
// forwarded, as after a healed partition.
func (p *Proxy) Heal() {
	p.mu.Lock()
	if p.holed != nil {
		close(p.holed)
		p.holed = nil
	}
	p.latency = 0
	p.mu.Unlock()
}

// Close stops accepting, closes every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	if p.holed != nil {
		close(p.holed)
		p.holed = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.l.Close()
	p.wg.Wait()
}

// gate returns the latency to apply and, when black-holed, a channel that
// closes when the hole heals.
func (p *Proxy) gate() (time.Duration, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency, p.holed
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	// A black hole also swallows new connections: accepted, never dialled.
	if _, holed := p.gate(); holed != nil {
		waitHeal(holed)
	}
	upstream, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		rst(client)
		return
	}
	if !p.track(upstream) {
		return
	}
	defer p.untrack(upstream)
	done := make(chan struct{}, 2)
	go func() { p.pipe(upstream, client); done <- struct{}{} }()
	go func() { p.pipe(client, upstream); done <- struct{}{} }()
	<-done
	// One side ended: end the other.
	client.Close()
	upstream.Close()
	<-done
}

// waitHeal waits until the hole heals or the proxy closes; nothing the
// client sends meanwhile is read, so it is all forwarded after the heal.
func waitHeal(holed chan struct{}) { <-holed }

// pipe copies src to dst chunk by chunk, applying the latency and holding
// chunks while black-holed.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			lat, holed := p.gate()
			if holed != nil {
				<-holed
				lat, _ = p.gate()
			}
			if lat > 0 {
				time.Sleep(lat)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a reset: serve closes both sides
		}
	}
}

// rst closes c so that the peer sees a reset rather than an orderly close.
func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}
