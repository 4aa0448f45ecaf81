package host

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// cutProxy forwards TCP connections to a database server and, once armed,
// cuts the connection whose client sends a given byte string: either just
// before forwarding it, or just after (so the server acts on it but its
// answer never arrives). The PostgreSQL and MySQL adaptors' tests cut
// commits with it.
type cutProxy struct {
	addr   string
	target string
	mu     sync.Mutex
	match  []byte
	after  bool
	left   int // cuts before the proxy disarms
	cuts   int
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: ln.Addr().String(), target: target}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			// mute is set before a cut-after chunk is forwarded: the
			// server's answer to it comes later and must not reach the
			// client (on loopback it would otherwise often win the race
			// with the close).
			var mute atomic.Bool
			wg.Add(2)
			go func() { // server to client
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if mute.Load() {
						return
					}
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() { // client to server, watching for the match
				defer wg.Done()
				defer s.Close()
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						cut, after := p.check(buf[:n])
						if cut && !after {
							return
						}
						if cut {
							mute.Store(true)
						}
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
						if cut {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

// arm makes the next chunk containing match cut its connection.
func (p *cutProxy) arm(match string, after bool) { p.armN(match, after, 1) }

// armN makes the next n chunks containing match cut their connections.
func (p *cutProxy) armN(match string, after bool, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.match, p.after, p.left = []byte(match), after, n
}

func (p *cutProxy) check(chunk []byte) (cut, after bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.match == nil || !bytes.Contains(chunk, p.match) {
		return false, false
	}
	if p.left--; p.left <= 0 {
		p.match = nil
	}
	p.cuts++
	return true, p.after
}
