package mvcc

import (
	"context"
	"sync"
)

// readBarrier lets concurrent follower reads share the store round trips
// that fetch the current and compacted revisions, without weakening
// linearizability: a read may only use a fetch that started after the read
// did, because only such a fetch is sure to see every write acknowledged
// before the read began. A read that arrives while a fetch is running waits
// for the next one, which starts as soon as the running one ends; every read
// arriving meanwhile shares that next fetch. So at most two fetches are in
// flight whatever the read rate (DESIGN.md, "The read barrier").
type readBarrier struct {
	fetch func(context.Context) (rev, compact int64, err error)

	mu      sync.Mutex
	running *barrierCall
	next    *barrierCall
}

type barrierCall struct {
	done         chan struct{}
	rev, compact int64
	err          error
}

func (r *readBarrier) wait(ctx context.Context) (int64, int64, error) {
	r.mu.Lock()
	var c *barrierCall
	if r.running == nil {
		c = &barrierCall{done: make(chan struct{})}
		r.running = c
		r.mu.Unlock()
		go r.run(c)
	} else {
		if r.next == nil {
			r.next = &barrierCall{done: make(chan struct{})}
		}
		c = r.next
		r.mu.Unlock()
	}
	select {
	case <-c.done:
		return c.rev, c.compact, c.err
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

// run performs one fetch, then starts the queued one, if any. Fetches use a
// background context: they are shared, so one caller's cancellation must
// not fail the others.
func (r *readBarrier) run(c *barrierCall) {
	for c != nil {
		c.rev, c.compact, c.err = r.fetch(context.Background())
		close(c.done)
		r.mu.Lock()
		c = r.next
		r.next = nil
		r.running = c
		r.mu.Unlock()
	}
}
