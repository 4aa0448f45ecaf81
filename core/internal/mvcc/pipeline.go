package mvcc

import (
	"context"
	"errors"
	"runtime/pprof"
	"sync"
	"time"
)

// The pipeline between the writer and the committer. The writer evaluates
// group N+1 while the committer commits group N, so evaluation is no longer
// added to the time a commit takes, and the engine's commit (an fsync, a
// network round trip) is no longer added to the writer's (DESIGN.md,
// "Pipelined group commit").
//
// Invariants:
//
//   - Groups reach the engine one at a time, in the order the writer
//     evaluated them: group N+1's Commit is called only after group N's
//     returned and N was published. So a group can never land without the
//     group it was built on, on any engine, whatever the engine does with
//     concurrent commits.
//   - A group is published (latest-record cache, lessor, watchers, clock)
//     and its requests are answered only after its own commit succeeded,
//     in group order: nothing is acknowledged before every group it was
//     built on committed.
//   - When a group fails (or its uncertain outcome resolves to "not
//     applied"), every group queued behind it was evaluated as if it had
//     applied: the pipeline is then broken, those groups are never
//     committed, and their requests go back to the writer, which resets its
//     state to the committed one and evaluates them again. None of them was
//     answered, none of their events was sent.
type pipeline struct {
	mu     sync.Mutex
	queue  []*group // evaluated, waiting for the committer, in order
	active bool     // the committer is committing or publishing a group
	closed bool
	// broken is set when a group failed; queue's requests were moved to
	// returned. The writer takes them back and clears it (takeReturned).
	broken   bool
	returned []*request
	depth    int
	// held keeps the pipeline looking busy so the writer gathers what
	// arrives into one group (tests of in-group behaviour only).
	held bool

	work chan struct{} // wakes the committer (one token)
	room chan struct{} // wakes a writer waiting for room, idleness or a break (one token)
}

// defaultPipelineDepth bounds the groups in the pipeline: one committing
// and up to three evaluated behind it. The writer hands its open group over
// as soon as the committer is idle, so more than one waits only when groups
// fill up (MaxGroupRequests, MaxGroupBytes) faster than the engine commits.
const defaultPipelineDepth = 4

func newPipeline(depth int) *pipeline {
	if depth < 1 {
		depth = defaultPipelineDepth
	}
	return &pipeline{depth: depth, work: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// idle reports whether the committer has nothing to do: the moment to hand
// over the open group.
func (p *pipeline) idle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.active && len(p.queue) == 0 && !p.held
}

// hold makes idle false until released, so that the writer keeps its open
// group; tests use it to put several requests in one group.
func (p *pipeline) hold(on bool) {
	p.mu.Lock()
	p.held = on
	p.mu.Unlock()
	signal(p.room)
}

func (p *pipeline) isBroken() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.broken
}

// inFlight is the number of groups committing or waiting to.
func (p *pipeline) inFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.queue)
	if p.active {
		n++
	}
	return n
}

// push queues g for the committer, waiting while the pipeline is full. It
// returns false, queuing nothing, when the pipeline is broken: g was built
// on a group that failed.
func (p *pipeline) push(g *group) bool {
	for {
		p.mu.Lock()
		if p.broken {
			p.mu.Unlock()
			return false
		}
		n := len(p.queue)
		if p.active {
			n++
		}
		if n < p.depth {
			p.queue = append(p.queue, g)
			p.mu.Unlock()
			signal(p.work)
			return true
		}
		p.mu.Unlock()
		<-p.room
	}
}

// drain waits until every queued group was committed or the pipeline broke;
// it returns false in the latter case.
func (p *pipeline) drain() bool {
	for {
		p.mu.Lock()
		switch {
		case p.broken:
			p.mu.Unlock()
			return false
		case !p.active && len(p.queue) == 0:
			p.mu.Unlock()
			return true
		}
		p.mu.Unlock()
		<-p.room
	}
}

// takeReturned waits for the committer to finish with the failed group,
// then hands the requests of the groups thrown away to the writer and mends
// the pipeline.
func (p *pipeline) takeReturned() []*request {
	for {
		p.mu.Lock()
		if !p.active {
			reqs := p.returned
			p.returned, p.broken = nil, false
			p.mu.Unlock()
			return reqs
		}
		p.mu.Unlock()
		<-p.room
	}
}

// close lets the committer exit once the queue is empty.
func (p *pipeline) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	signal(p.work)
}

// next returns the group to commit, or nil once closed and empty.
func (p *pipeline) next() *group {
	for {
		p.mu.Lock()
		if len(p.queue) > 0 {
			g := p.queue[0]
			p.queue[0] = nil
			p.queue = p.queue[1:]
			p.active = true
			p.mu.Unlock()
			return g
		}
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return nil
		}
		<-p.work
	}
}

// done ends the committer's work on a group. On failure, retry (requests
// of the failed group to evaluate again, e.g. one by one after a batch too
// large) and the requests of every queued group go back to the writer, in
// order.
func (p *pipeline) done(failed bool, retry []*request) {
	p.mu.Lock()
	p.active = false
	if failed {
		p.broken = true
		p.returned = append(p.returned, retry...)
		for i, g := range p.queue {
			p.returned = append(p.returned, g.reqs...)
			p.queue[i] = nil
		}
		p.queue = p.queue[:0]
	}
	p.mu.Unlock()
	signal(p.room)
}

// commitLoop is the committer: it commits the writer's groups one at a time
// and publishes and answers each.
func (b *Backend) commitLoop(p *pipeline) {
	defer b.wg.Done()
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("engram", "committer")))
	for {
		g := p.next()
		if g == nil {
			return
		}
		err := b.commitGroup(g)
		if err == nil {
			start := time.Now()
			b.committedSeq.Store(g.seq)
			g.answer()
			if b.metrics != nil {
				b.metrics.committerBusy.Add(time.Since(start).Seconds() + g.publishSeconds)
			}
			p.done(false, nil)
			continue
		}
		var retry []*request
		switch {
		case errors.Is(err, errPresumedAbsent):
			// Nothing was written: the group's requests go round again,
			// and read the key that exists (presume.go).
			b.presume.failed()
			if b.metrics != nil {
				b.metrics.presumeFailed.Inc()
			}
			retry = g.reqs
		case errors.Is(err, ErrTooLarge) && len(g.reqs) > 1:
			// Nothing was written. Each request goes again in a group of
			// its own, so only the one that is too large fails.
			for _, r := range g.reqs {
				r.solo = true
			}
			retry = g.reqs
		default:
			g.fail(err)
		}
		// Its sequence number is done with: it will never land.
		b.committedSeq.Store(g.seq)
		p.done(true, retry)
	}
}
