//go:build !wasip1

package sqltest

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/engramkv/engram/internal/tcptest"
)

// cutProxy forwards TCP connections to a database server and, once armed,
// cuts the connection whose client sends a given byte string: either just
// before forwarding it, or once the server has answered it (so the server
// has acted on it but its answer never arrives). The PostgreSQL and MySQL adaptors' tests cut
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
	p := &cutProxy{target: target}
	p.addr = tcptest.Serve(t, p.serve, nil)
	return p
}

// serve forwards one client connection until either end closes it or a
// cut does.
func (p *cutProxy) serve(c net.Conn, wg *sync.WaitGroup) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	// mute is set before a cut-after chunk is forwarded: the server's
	// answer to it must not reach the client. The cut itself waits for
	// that answer, so the server has acted on the chunk (committed) before
	// the client sees its connection fail; cutting at once would race the
	// client's next statement on a new connection against the server's
	// commit.
	var mute atomic.Bool
	wg.Add(1)
	go func() { // server to client; closes both ends
		defer wg.Done()
		defer s.Close()
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
	// client to server, watching for the match
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			cut, after := p.check(buf[:n])
			if cut && !after {
				_ = s.Close()
				_ = c.Close()
				return
			}
			if cut {
				mute.Store(true)
			}
			if _, werr := s.Write(buf[:n]); werr != nil {
				_ = s.Close()
				return
			}
			if cut {
				return // the other side cuts once the answer arrives
			}
		}
		if err != nil {
			_ = s.Close()
			return
		}
	}
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
