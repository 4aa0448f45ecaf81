package mvcc

import (
	"hash/maphash"
	"time"
	"unsafe"

	"github.com/engramkv/engram/core/internal/coder"
)

// The writer's own state, kept by the one goroutine that evaluates writes
// (writeloop.go) and read by nobody else: the revision it has reached, the
// keys written by groups still in the pipeline, and what it needs to judge a
// prefetched record (prefetch.go).
//
// Invariants:
//
//   - w.rev is the published revision plus the revisions of the groups in
//     the pipeline: the next transaction that changes something takes
//     w.rev+1 (or its group's rev+1 while a group is open).
//   - pending[k] is the state of k after the newest pushed group that wrote
//     k, for as long as that group is not known to have committed. The
//     engine does not show a pipelined group's writes before its commit, so
//     an evaluation must find them here first; once the group committed,
//     the latest-record cache and the engine show the same state and the
//     entry may go.
//   - A pushed group's keyStates are never modified again: the committer
//     reads them while the writer evaluates the next group, which copies
//     what it needs from pending into keyStates of its own.
//   - After a failed group the writer throws away every group built on it
//     (pending, rev) and evaluates their requests again against what the
//     store holds (pipeline.go, "broken").
type writer struct {
	b *Backend
	p *pipeline

	rev int64
	// seq is the sequence number of the last pushed group. It never goes
	// back, also when groups are thrown away: prefetch validation compares
	// sequence numbers, and revisions may be reused after a failure.
	seq uint64

	pending  map[string]*keyState
	inflight []*group // pushed and not yet pruned, oldest first
	written  writeSeqs
	// recent holds the keys each of the last pushed groups wrote, oldest
	// first, to judge ranges read ahead (prefetch.go); recentKeys counts
	// them.
	recent     []recentWrites
	recentKeys int

	// again holds requests to evaluate before new arrivals: the requests
	// of groups thrown away after a failure, in their original order.
	again []*request

	seed maphash.Seed
}

func newWriter(b *Backend) *writer {
	return &writer{
		b:       b,
		p:       newPipeline(b.pipelineDepth),
		rev:     b.clock.Current(),
		pending: map[string]*keyState{},
		written: newWriteSeqs(writeSeqsSize),
		seed:    maphash.MakeSeed(),
	}
}

// open starts a group on top of everything the writer evaluated so far.
func (w *writer) open() *group {
	g := newGroup(w.b, w.rev)
	g.w = w
	// Every revision below the group is committed: a Range at such a
	// revision may read the store (txnrange.go).
	g.quiet = w.rev == w.b.clock.Current()
	return g
}

// prune forgets the pending states of groups the committer has finished.
func (w *writer) prune() {
	done := w.b.committedSeq.Load()
	n := 0
	for _, g := range w.inflight {
		if g.seq > done {
			break
		}
		for k, s := range g.keys {
			if p, ok := w.pending[k]; ok && p == s {
				delete(w.pending, k)
			}
		}
		n++
	}
	if n > 0 {
		clear(w.inflight[:n])
		w.inflight = w.inflight[n:]
	}
}

// finish prepares an evaluated group for the committer: its batch is
// encoded here, while its states are still the writer's, and its writes
// become the pending state later groups build on.
func (w *writer) finish(g *group) {
	start := time.Now()
	w.seq++
	g.seq = w.seq
	g.ops = g.batch()
	rw := recentWrites{seq: g.seq, keys: make([]string, 0, len(g.keys))}
	for k, s := range g.keys {
		if !s.dirty {
			continue
		}
		w.pending[k] = s
		w.written.note(maphash.String(w.seed, k), g.seq)
		rw.keys = append(rw.keys, k)
	}
	w.remember(rw)
	w.rev = g.rev
	w.inflight = append(w.inflight, g)
	g.evalNanos += int64(time.Since(start))
}

// reset drops every group that was not committed after a failure: their
// pending states and revisions never happened. The store and the
// latest-record cache hold exactly the committed groups.
func (w *writer) reset() {
	clear(w.pending)
	clear(w.inflight)
	w.inflight = w.inflight[:0]
	w.rev = w.b.clock.Current()
}

// recentWrites is the keys one pushed group wrote.
type recentWrites struct {
	seq  uint64
	keys []string
}

// The writer remembers the keys of its last recentGroups groups, at most
// recentKeysMax keys: a range read ahead is judged against them, and a
// request reaches the writer within a few groups of its read.
const (
	recentGroups  = 64
	recentKeysMax = 1 << 16
)

func (w *writer) remember(rw recentWrites) {
	w.recent = append(w.recent, rw)
	w.recentKeys += len(rw.keys)
	n := 0
	for len(w.recent)-n > recentGroups || (w.recentKeys > recentKeysMax && len(w.recent)-n > 1) {
		w.recentKeys -= len(w.recent[n].keys)
		w.recent[n] = recentWrites{}
		n++
	}
	w.recent = w.recent[n:]
}

// wroteInRange reports whether a group numbered above seq may have written
// a key in [key, end): it did, or it is older than the groups remembered.
func (w *writer) wroteInRange(key, end []byte, seq uint64) bool {
	if seq >= w.seq {
		return false // nothing pushed since
	}
	if len(w.recent) == 0 || w.recent[0].seq > seq+1 {
		return true
	}
	for _, rw := range w.recent {
		if rw.seq <= seq {
			continue
		}
		for _, k := range rw.keys {
			if coder.InRange(unsafe.Slice(unsafe.StringData(k), len(k)), key, end) {
				return true
			}
		}
	}
	return false
}
