package mvcc

import (
	"bytes"
	"context"
	"hash/maphash"
	"slices"
	"unsafe"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// A write group is the writer's working state for one commit: each touched
// key's state as of the requests evaluated so far (keyState), the versions
// they staged, and the engine batch that writes them all at once.

// keyState is a key's state as the writer sees it within a group.
type keyState struct {
	// base is the revision key's value in the store before this group (nil
	// when absent): the expected value of the group's compare-and-swap.
	base []byte
	// cur is the latest header including this group's writes; exists is
	// false when the revision key is absent (never written, or cleaned up).
	cur    Version
	exists bool
	// value is cur's value (the revision key holds it).
	value []byte
	dirty bool
	// deleteRevKey removes the revision key instead of writing cur.
	deleteRevKey bool
	// presumed: absent was presumed, not read (presume.go); the group's
	// put-if-absent of the revision key is what checks it.
	presumed bool
	// written is the record batch encoded for the revision key (nil when it
	// deletes it), for the latest-record cache once the batch committed.
	written []byte

	// stagedRev is the revision of the group that last staged a version of
	// the key (0: none). One transaction may change a key more than once
	// (etcd accepts a put and a delete covering it in one transaction);
	// only the last version of a revision is ever readable, so the ones
	// before it replace each other instead of going to history.
	stagedRev int64
	// before is the key's live version before stagedRev (nil: not live):
	// the prev_kv of every event of that revision, as etcd reads it.
	before *mvccpb.KeyValue
	// past holds the key's last version of each earlier revision of the
	// group, oldest first, for a transaction's Range at such a revision
	// (txnrange.go). The version before the group is base.
	past []staged
}

func (s *keyState) live() bool { return s.exists && !s.cur.Tombstone }

// group accumulates the writes of one commit.
type group struct {
	b       *Backend
	w       *writer
	seq     uint64 // set when the writer hands it to the committer
	baseRev int64
	rev     int64
	// quiet: every revision up to baseRev was committed when the group
	// opened, so the store answers a read at any of them.
	quiet   bool
	keys    map[string]*keyState
	objects []kv.Op
	changes []Change // of the transaction being executed
	logs    []kv.Op
	leases  map[string]kv.Op
	events  []*mvccpb.Event
	after   []func()

	witnessKey   []byte
	witnessValue []byte
	witnessGone  bool

	// compaction holds a compaction request's ops: they take no revision
	// and touch no revision key.
	compaction []kv.Op

	// The requests of the group and their answers, sent once the group
	// committed (or failed).
	reqs    []*request
	results []result
	live    []bool
	// Room for the requests of a small group (a quiet server's are one
	// request each) without allocating.
	reqsBuf    [4]*request
	resultsBuf [4]result
	liveBuf    [4]bool
	size       int
	// cur is the request being evaluated: state() consults its prefetch.
	cur *request
	// ops is the engine batch, encoded by the writer (writer.finish).
	ops []kv.Op

	evalNanos      int64   // writer time spent on the group
	publishSeconds float64 // committer time spent publishing it

	// Scratch the writer reuses: a transaction's compare path, and
	// keyStates allocated a chunk at a time.
	path []bool
	slab []keyState
	grow int
}

// newState returns a zeroed keyState from the group's current chunk.
func (g *group) newState() *keyState {
	if len(g.slab) == 0 {
		// Chunks double from 4 to 64 states: a group of one write
		// allocates little, a group of hundreds few times.
		g.grow = min(max(g.grow*2, 4), 64)
		g.slab = make([]keyState, g.grow)
	}
	s := &g.slab[0]
	g.slab = g.slab[1:]
	return s
}

func newGroup(b *Backend, rev int64) *group {
	g := &group{b: b, baseRev: rev, rev: rev, keys: map[string]*keyState{}}
	g.reqs, g.results, g.live = g.reqsBuf[:0], g.resultsBuf[:0], g.liveBuf[:0]
	return g
}

// state loads a key's state: this group's own, else the state a group still
// in the pipeline left (writer.pending), else the record the request
// prefetched if no later write may have changed it (prefetch.go), else the
// latest-record cache or the store.
func (g *group) state(key []byte) (*keyState, error) {
	if s, ok := g.keys[string(key)]; ok {
		return s, nil
	}
	s := g.newState()
	if p, ok := g.pending(key); ok {
		if !p.deleteRevKey {
			s.base, s.cur, s.exists, s.value = p.written, p.cur, true, p.value
		}
		g.keys[string(key)] = s
		return s, nil
	}
	raw, presumed, err := g.record(key)
	s.presumed = presumed
	h, val, found, err := decodeRead(raw, err, "get revision key")
	if err != nil {
		return nil, err
	}
	if found {
		s.base, s.cur, s.exists, s.value = raw, h, true, val
	}
	g.keys[string(key)] = s
	return s, nil
}

// pending returns the state a group in the pipeline left for key.
func (g *group) pending(key []byte) (*keyState, bool) {
	if g.w == nil {
		return nil, false
	}
	p, ok := g.w.pending[string(key)]
	return p, ok
}

// record returns key's revision-key record as of the writes before this
// group: prefetched when still valid, else read now. presumed reports an
// absence presumed, not read (presume.go).
func (g *group) record(key []byte) (raw []byte, presumed bool, err error) {
	var pf *prefetch
	if g.cur != nil {
		pf = g.cur.prefetch
	}
	if r, ok := pf.lookup(key); ok && g.w != nil {
		if !g.w.written.since(maphash.Bytes(g.w.seed, key), pf.seq) {
			if r.presumed {
				g.b.metrics.prefetched(prefetchPresumed)
				return nil, true, kv.ErrNotFound
			}
			g.b.metrics.prefetched(prefetchUsed)
			if !r.found {
				return nil, false, kv.ErrNotFound
			}
			return r.raw, false, nil
		}
		g.b.metrics.prefetched(prefetchStale)
	} else {
		g.b.metrics.prefetched(prefetchNone)
	}
	raw, err = g.b.latestRecord(context.Background(), key)
	return raw, false, err
}

// rangeAhead returns the revision-key records of [key, end) the request
// read ahead, if it did and no group since may have written in the range.
func (g *group) rangeAhead(key, end []byte) ([]kv.Pair, bool) {
	if g.cur == nil || g.w == nil {
		return nil, false
	}
	pf := g.cur.prefetch
	r, ok := pf.lookupRange(key, end)
	switch {
	case !ok:
		g.b.metrics.prefetched(prefetchNone)
		return nil, false
	case g.w.wroteInRange(key, end, pf.seq):
		g.b.metrics.prefetched(prefetchStale)
		return nil, false
	}
	g.b.metrics.prefetched(prefetchUsed)
	return r.pairs, true
}

// liveRange returns the live keys in [key, end) as of this group, sorted.
func (g *group) liveRange(key, end []byte) ([][]byte, error) {
	if len(end) == 0 {
		s, err := g.state(key)
		if err != nil {
			return nil, err
		}
		if s.live() {
			return [][]byte{key}, nil
		}
		return nil, nil
	}
	seen := map[string]bool{}
	var out [][]byte
	visit := func(p kv.Pair) error {
		k, err := coder.DecodeRevisionKey(p.Key)
		if err != nil {
			return err
		}
		seen[string(k)] = true
		if s, ok := g.keys[string(k)]; ok {
			if s.live() {
				out = append(out, k)
			}
			return nil
		}
		if _, ok := g.pending(k); ok {
			// A group in the pipeline wrote it: its state, not the
			// store's, is the latest.
			s, err := g.state(k)
			if err != nil {
				return err
			}
			if s.live() {
				out = append(out, k)
			}
			return nil
		}
		h, val, err := decodeHeader(p.Value)
		if err != nil {
			return err
		}
		if !h.Tombstone {
			s := g.newState()
			s.base, s.cur, s.exists, s.value = p.Value, h, true, val
			g.keys[string(k)] = s
			out = append(out, k)
		}
		return nil
	}
	if pairs, ok := g.rangeAhead(key, end); ok {
		for _, p := range pairs {
			if err := visit(p); err != nil {
				return nil, err
			}
		}
	} else {
		start, stop := coder.RevisionRange(key, end)
		if err := kv.ScanEach(context.Background(), g.b.store, kv.ScanOptions{Start: start, End: stop, BatchSize: 1024}, visit); err != nil {
			return nil, storageErr("scan", err)
		}
	}
	// Keys created by this group or by groups in the pipeline are not in
	// the store yet.
	if g.w != nil {
		for k := range g.w.pending {
			if !seen[k] && coder.InRange([]byte(k), key, end) {
				seen[k] = true
				s, err := g.state([]byte(k))
				if err != nil {
					return nil, err
				}
				if s.live() {
					out = append(out, []byte(k))
				}
			}
		}
	}
	for k, s := range g.keys {
		if !seen[k] && s.live() && coder.InRange([]byte(k), key, end) {
			out = append(out, []byte(k))
		}
	}
	slices.SortFunc(out, bytes.Compare)
	return out, nil
}

// stageVersion adds one key's new version to the group: the version it
// replaces moves to history, and the change-log entry, lease index changes
// and watch event follow; the revision key itself is written by batch.
//
// o holds the event; its prev is the version the change replaces (nil: the
// key was not live), filled by newEvent.
func (g *group) stageVersion(key []byte, s *keyState, h Version, value []byte, o *eventOut) {
	prev := o.ev.PrevKv
	oldLease := int64(0)
	if s.live() {
		oldLease = s.cur.Lease
	}
	if s.stagedRev != h.ModRev {
		if s.stagedRev != 0 {
			s.past = append(s.past, staged{hdr: s.cur, value: s.value, exists: s.exists})
		}
		if s.exists {
			// The version being replaced (a tombstone too: reads between
			// the delete and this write must see the key deleted) moves
			// to history.
			// Its key and record share one allocation.
			buf := coder.AppendObjectKey(make([]byte, 0, coder.ObjectKeyLen(key)+objectLen(s.value)), key, s.cur.ModRev)
			ok := buf[:len(buf):len(buf)]
			g.objects = append(g.objects, kv.Put(ok, append(appendHeader(buf[len(buf):], s.cur), s.value...)))
		}
		s.stagedRev, s.before = h.ModRev, prev
	} else if !s.cur.Tombstone {
		// A put of this transaction is superseded: its change keeps it.
		g.changes[s.cur.Sub].Superseded = encodeObject(s.cur, s.value)
	}
	// etcd numbers the changes of a transaction from 0 in execution order.
	h.Sub = int64(len(g.changes))
	s.cur, s.exists, s.dirty, s.value, s.deleteRevKey = h, true, true, value, false
	// The event's previous version is the key's before this revision, as
	// etcd reads it; a put that creates the key has none.
	evPrev := s.before
	if !h.Tombstone && h.Version == 1 {
		evPrev = nil
	}
	c := Change{Deleted: h.Tombstone, Key: key}
	if evPrev != nil {
		c.PrevRev = evPrev.ModRevision
	}
	g.changes = append(g.changes, c)
	if oldLease != h.Lease {
		k := append([]byte(nil), key...)
		if oldLease != 0 {
			ik := coder.LeaseIndexKey(oldLease, key)
			g.leaseOp(ik, kv.Delete(ik))
			g.after = append(g.after, func() { g.b.lessor.Detach(oldLease, k) })
		}
		if h.Lease != 0 {
			ik := coder.LeaseIndexKey(h.Lease, key)
			g.leaseOp(ik, kv.Put(ik, nil))
			newLease := h.Lease
			g.after = append(g.after, func() { g.b.lessor.Attach(newLease, k) })
		}
	}
	ev := &o.ev
	ev.PrevKv, ev.Kv = evPrev, &o.kv
	o.kv.Key, o.kv.ModRevision = key, h.ModRev
	if h.Tombstone {
		ev.Type = mvccpb.DELETE
	} else {
		ev.Type = mvccpb.PUT
		o.kv.CreateRevision, o.kv.Version, o.kv.Lease, o.kv.Value = h.CreateRev, h.Version, h.Lease, value
	}
	g.events = append(g.events, ev)
}

// appendLog adds the change-log record of rev. The group's first record is
// written with PutIfAbsent: a writer whose clock is stale (a second writer on
// the same store) then fails its whole batch instead of overwriting another
// writer's revision. One check per group is enough because every writer
// allocates revisions densely: whoever wrote any later revision of this
// group also wrote its first. The others are plain puts, which spares the
// engine a read per write.
func (g *group) appendLog(rev int64) {
	// The key and the record share one allocation.
	buf := coder.AppendEventKey(make([]byte, 0, coder.EventKeyLen+changesLen(g.changes)), rev)
	key := buf[:len(buf):len(buf)]
	op := kv.Put(key, appendChanges(buf[len(buf):], g.changes))
	if len(g.logs) == 0 {
		op.Kind = kv.OpPutIfAbsent
	}
	g.logs = append(g.logs, op)
	g.witnessKey, g.witnessValue, g.witnessGone = op.Key, op.Value, false
}

// witness returns a key that only this group's batch writes (or removes), to
// read back after an uncertain commit.
func (g *group) witness() ([]byte, bool) {
	return g.witnessKey, !g.witnessGone
}

// batch assembles the group's atomic batch.
func (g *group) batch() []kv.Op {
	ops := make([]kv.Op, 0, len(g.keys)+len(g.objects)+len(g.logs)+len(g.leases))
	for k, s := range g.keys {
		if !s.dirty {
			continue
		}
		// The revision key and the record share one allocation.
		kb := unsafe.Slice(unsafe.StringData(k), len(k))
		buf := coder.AppendRevisionKey(make([]byte, 0, coder.RevisionKeyLen(kb)+objectLen(s.value)), kb)
		rk := buf[:len(buf):len(buf)]
		switch {
		case s.deleteRevKey:
			ops = append(ops, kv.CompareAndDelete(rk, s.base))
		case s.base == nil:
			s.written = append(appendHeader(buf[len(buf):], s.cur), s.value...)
			ops = append(ops, kv.PutIfAbsent(rk, s.written))
		default:
			s.written = append(appendHeader(buf[len(buf):], s.cur), s.value...)
			ops = append(ops, kv.CompareAndSwap(rk, s.base, s.written))
		}
	}
	ops = append(ops, g.objects...)
	ops = append(ops, g.logs...)
	ops = append(ops, g.compaction...)
	for _, op := range g.leases {
		ops = append(ops, op)
	}
	if g.witnessKey == nil && len(ops) > 0 {
		// Only tombstone cleanup: the first revision key op witnesses it.
		g.witnessKey, g.witnessGone = ops[0].Key, ops[0].Kind == kv.OpCompareAndDelete
		g.witnessValue = ops[0].Value
	}
	return ops
}

// leaseOp sets the batch's op on a lease record or lease index key.
func (g *group) leaseOp(key []byte, op kv.Op) {
	if g.leases == nil {
		g.leases = map[string]kv.Op{}
	}
	g.leases[string(key)] = op
}

// eventOut is a change's event with its key-values, in one allocation.
type eventOut struct {
	ev       mvccpb.Event
	kv, prev mvccpb.KeyValue
}

// newEvent starts the event of a change to key in state s: its PrevKv is
// the key's live version, if any.
func newEvent(key []byte, s *keyState) *eventOut {
	o := &eventOut{}
	if s.live() {
		o.prev = mvccpb.KeyValue{Key: key, CreateRevision: s.cur.CreateRev, ModRevision: s.cur.ModRev,
			Version: s.cur.Version, Lease: s.cur.Lease, Value: s.value}
		o.ev.PrevKv = &o.prev
	}
	return o
}
