// Package groupcommit is the queue between an embedded adaptor's Commit
// calls and its single committer goroutine: callers enqueue a request and
// wait, the committer takes every request queued while it wrote the previous
// group and commits them together, so that concurrent Commits share one WAL
// write and one fsync (DESIGN.md, "Group commit").
//
// It owns the request's life (queued, taken by the committer, or abandoned
// by a caller who gave up), the forming of groups, and the committer's
// counts (Counters, Stats) with the answering of a written group
// (Counters.Answer: what a failed write makes of each member's result). It
// must not evaluate or apply batches: that is the adaptor's committer,
// which alone judges each batch.
package groupcommit

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/engramkv/engram/core/kv"
)

// Request states. A request is queued until the committer takes it or its
// caller gives up; exactly one of the two wins the compare-and-swap, so a
// caller that gave up knows its batch will never be applied.
const (
	queued int32 = iota
	taken
	abandoned
)

// Request is one Commit (or one Run) waiting for the committer.
type Request struct {
	Ops []kv.Op
	// Size and Count are the request's share of what bounds a group, as the
	// adaptor measures it (bytes and ops against an engine's transaction
	// limits); the queue closes a group at MaxBytes of Size.
	Size, Count int64
	// Run, when set, is not a batch: the committer calls it between two
	// groups, with no write in flight, and answers with its error.
	Run func() error
	// Result is set by the committer while it owns the request, then sent
	// by Reply.
	Result error

	state atomic.Int32
	done  chan error
}

// NewRequest returns a queued request for ops.
func NewRequest(ops []kv.Op) *Request {
	return &Request{Ops: ops, done: make(chan error, 1)}
}

// Take claims r for the committer; false when its caller gave up first, and
// then the committer must leave it out.
func (r *Request) Take() bool { return r.state.CompareAndSwap(queued, taken) }

// Reply answers r's caller with r.Result. The committer calls it exactly
// once for every request it took.
func (r *Request) Reply() { r.done <- r.Result }

// Done delivers r's answer.
func (r *Request) Done() <-chan error { return r.done }

// Queue carries requests to the committer.
type Queue struct {
	reqs     chan *Request
	stopped  chan struct{}
	name     string
	maxGroup int
	maxBytes int64
}

// NewQueue returns a queue whose groups hold at most maxGroup requests and
// stop growing once they hold maxBytes of Size (0: no bound). Errors of
// requests that never reached the committer are prefixed with name.
func NewQueue(name string, maxGroup int, maxBytes int64) *Queue {
	return &Queue{
		// Committers enqueue while a group is being written, which is
		// what forms the next group.
		reqs:     make(chan *Request, 4*maxGroup),
		stopped:  make(chan struct{}),
		name:     name,
		maxGroup: maxGroup,
		maxBytes: maxBytes,
	}
}

// Submit enqueues r and returns its answer. If ctx ends before the
// committer took r, r will never be applied and Submit says so; once the
// committer has it, Submit waits for the answer, at most one group write
// away, which spares the caller an uncertain outcome and keeps the caller
// from reusing op buffers the committer is still reading. Submit must not
// be called after Close.
func (q *Queue) Submit(ctx context.Context, r *Request) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: commit not applied: %w", q.name, err)
	}
	select {
	case q.reqs <- r:
	case <-ctx.Done():
		return fmt.Errorf("%s: commit not applied: %w", q.name, ctx.Err())
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		if r.state.CompareAndSwap(queued, abandoned) {
			return fmt.Errorf("%s: commit not applied: %w", q.name, ctx.Err())
		}
		return <-r.done
	}
}

// Run is the committer's loop: it passes commit every request queued while
// the previous group was committed, in arrival order, until Close. commit
// must Take each request before using it and Reply to each it took.
func (q *Queue) Run(commit func(group []*Request)) {
	defer close(q.stopped)
	group := make([]*Request, 0, q.maxGroup)
	for {
		r, ok := <-q.reqs
		if !ok {
			return
		}
		group = append(group[:0], r)
		size := r.Size
	fill:
		for len(group) < q.maxGroup && (q.maxBytes <= 0 || size < q.maxBytes) {
			select {
			case r, ok := <-q.reqs:
				if !ok {
					break fill // closing: finish this group; the next receive ends the loop
				}
				group = append(group, r)
				size += r.Size
			default:
				break fill
			}
		}
		commit(group)
		clear(group)
	}
}

// Close stops taking requests and waits for Run to finish the group it has.
// No Submit may be running or follow (the adaptors' gates ensure it).
func (q *Queue) Close() {
	close(q.reqs)
	<-q.stopped
}
