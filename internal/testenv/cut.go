package testenv

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
)

// CutProxy forwards TCP connections to a target and, once armed, cuts the
// answer to one request: the response stream of an HTTP client breaks
// after its request was sent, as a network failure would break it.
type CutProxy struct {
	t      testing.TB
	target string
	l      net.Listener

	mu     sync.Mutex
	marker []byte // the request to cut contains it; nil: disarmed
	both   bool
	cuts   int
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// StartCutProxy listens on 127.0.0.1 on a free port, forwards to target
// (host:port), and stops when the test ends.
func StartCutProxy(t testing.TB, target string) *CutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: cut proxy: %v", err)
	}
	p := &CutProxy{t: t, target: target, l: l, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the address clients connect to instead of the target.
func (p *CutProxy) Addr() string { return p.l.Addr().String() }

// CutResponse arms the proxy: the next request that contains marker is
// forwarded whole, and when the target begins to answer, the client's
// connection is closed. The target's answer is read and dropped: the
// target never learns that its client is gone.
func (p *CutProxy) CutResponse(marker string) { p.arm(marker, false) }

// CutBoth arms the proxy: the next request that contains marker is
// forwarded, then both connections are closed at once, so that the target
// sees its client leave while it handles the request.
func (p *CutProxy) CutBoth(marker string) { p.arm(marker, true) }

func (p *CutProxy) arm(marker string, both bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker, p.both = []byte(marker), both
}

// Cuts is how many requests the proxy cut.
func (p *CutProxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

func (p *CutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *CutProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// take reports whether the proxy is armed for a request containing what
// was just read (with the tail of what came before), and disarms it.
func (p *CutProxy) take(seen []byte) (cut, both bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.marker == nil || !bytes.Contains(seen, p.marker) {
		return false, false
	}
	both = p.both
	p.marker, p.cuts = nil, p.cuts+1
	return true, both
}

func (p *CutProxy) serve(client net.Conn) {
	defer p.wg.Done()
	upstream, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, upstream) {
		client.Close()
		upstream.Close()
		return
	}
	var cutting sync.Once
	cut := make(chan struct{}) // closed once this connection's next answer is to be cut
	p.wg.Add(1)
	go func() { // target → client
		defer p.wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := upstream.Read(buf)
			if n > 0 {
				select {
				case <-cut:
					client.Close()
					io.Copy(io.Discard, upstream) // the target answers into nothing
					return
				default:
				}
				if _, err := client.Write(buf[:n]); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		client.Close()
	}()
	buf := make([]byte, 32<<10)
	var tail []byte
	for { // client → target
		n, err := client.Read(buf)
		if n > 0 {
			seen := append(tail, buf[:n]...)
			doCut, both := p.take(seen)
			if _, err := upstream.Write(buf[:n]); err != nil {
				break
			}
			if doCut && both {
				client.Close()
				upstream.Close()
				return
			}
			if doCut {
				cutting.Do(func() { close(cut) })
			}
			tail = append([]byte(nil), seen[max(0, len(seen)-256):]...)
		}
		if err != nil {
			break
		}
	}
	select {
	case <-cut: // the target's answer is still being dropped
	default:
		upstream.Close()
	}
}

func (p *CutProxy) close() {
	p.l.Close()
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	p.wg.Wait()
}
