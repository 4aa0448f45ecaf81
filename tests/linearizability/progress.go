package linearizability

import (
	"context"
	"sync"
)

// progress is a number that only grows (writes acknowledged, the revision a
// watcher reached) and a way to wait for it to reach a value.
type progress struct {
	mu sync.Mutex
	v  int64
	// more is closed and replaced whenever v grows.
	more chan struct{}
}

func newProgress(v int64) *progress { return &progress{v: v, more: make(chan struct{})} }

func (p *progress) get() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.v
}

// add raises the value by n.
func (p *progress) add(n int64) { p.advance(p.get() + n) }

// advance raises the value to v; a lower v changes nothing. Callers that
// add serialise among themselves (the Recorder's lock).
func (p *progress) advance(v int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v > p.v {
		p.v = v
		close(p.more)
		p.more = make(chan struct{})
	}
}

// await waits until the value is at least v or ctx ends, and returns the
// value and whether it got there.
func (p *progress) await(ctx context.Context, v int64) (int64, bool) {
	for {
		p.mu.Lock()
		cur, more := p.v, p.more
		p.mu.Unlock()
		if cur >= v {
			return cur, true
		}
		select {
		case <-more:
		case <-ctx.Done():
			return cur, false
		}
	}
}
