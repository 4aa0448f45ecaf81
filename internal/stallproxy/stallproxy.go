// Package stallproxy is a TCP proxy for tests that can stall: once told,
// it forwards a given number of bytes more from the server and then
// nothing in either direction, keeping every connection open, as a network
// partition looks to both ends (no reset, no end of file, just silence). New
// connections are accepted and then held the same way. Tests check with it
// that a client gives up on a silent server instead of hanging.
//
// It owns only the connections it accepted (on internal/tcptest's
// listener) and dialled, all on 127.0.0.1, closed when the test ends; it
// must not sleep or read the wall clock.
package stallproxy

import (
	"net"
	"sync"
	"testing"

	"github.com/engramkv/engram/internal/tcptest"
)

// Proxy forwards connections to a target until it stalls.
type Proxy struct {
	// Addr is the proxy's "127.0.0.1:PORT".
	Addr   string
	target string

	mu      sync.Mutex
	budget  int64 // bytes from the server still forwarded; < 0: no limit
	stalled chan struct{}
	done    chan struct{}
	conns   []net.Conn
}

// Start starts a proxy to target for t, closed at t.Cleanup.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	p := &Proxy{target: target, budget: -1, stalled: make(chan struct{}), done: make(chan struct{})}
	p.Addr = tcptest.Serve(t, func(c net.Conn, wg *sync.WaitGroup) {
		if p.track(c) {
			p.serve(c, wg)
		}
	}, func() {
		close(p.done)
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

// StallAfter makes the proxy go silent once n more bytes from the server
// have been forwarded (0: at once).
func (p *Proxy) StallAfter(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.budget = n
	if n == 0 {
		p.stallLocked()
	}
}

// Stalled is closed when the proxy has gone silent.
func (p *Proxy) Stalled() <-chan struct{} { return p.stalled }

func (p *Proxy) stallLocked() {
	select {
	case <-p.stalled:
	default:
		close(p.stalled)
	}
}

// track records a connection to close at cleanup; false once closing.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		_ = c.Close()
		return false
	default:
	}
	p.conns = append(p.conns, c)
	return true
}

// hold blocks until the test ends: a stalled connection neither forwards
// nor closes.
func (p *Proxy) hold() { <-p.done }

func (p *Proxy) serve(c net.Conn, wg *sync.WaitGroup) {
	select {
	case <-p.stalled:
		p.hold()
		return
	default:
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	if !p.track(s) {
		return
	}
	wg.Add(1)
	go func() { // client to server
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			select {
			case <-p.stalled:
				p.hold()
				return
			default:
			}
			if n > 0 {
				if _, werr := s.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				_ = s.Close()
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for { // server to client
		n, err := s.Read(buf)
		n = p.allow(n)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		select {
		case <-p.stalled:
			p.hold()
			return
		default:
		}
		if err != nil {
			_ = c.Close()
			return
		}
	}
}

// allow returns how many of n bytes from the server may be forwarded,
// stalling the proxy when the budget runs out.
func (p *Proxy) allow(n int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.stalled:
		return 0
	default:
	}
	if p.budget < 0 {
		return n
	}
	if int64(n) >= p.budget {
		n = int(p.budget)
		p.budget = 0
		p.stallLocked()
		return n
	}
	p.budget -= int64(n)
	return n
}
