package mvcc

import (
	"bytes"
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// Prefetching: the records a write needs (each key its compares, puts,
// deletes and ranges name without a range end) are read by the request's
// own goroutine before the request is queued to the writer, so the writer,
// which evaluates every write one after another, does no engine I/O in the
// common case. On a remote engine each such read is a network round trip;
// done inside the writer they were serial, one per new key (DESIGN.md,
// "Prefetched records").
//
// The rule that makes a prefetched record safe to use:
//
//   - A prefetch first reads S, the sequence number of the last group the
//     committer finished (committedSeq), then reads the record (from the
//     latest-record cache or the engine). Every group numbered S or lower
//     is committed and visible there, or failed and never will be.
//   - The record may stand for the key's state when the writer evaluates
//     the request in group G only if no group numbered above S and below G
//     wrote the key. Such a group is either in the pipeline (its write is
//     not in the store yet) or committed after S (the read may or may not
//     have seen it). The writer records, for every key a group writes, that
//     group's number in writeSeqs before the group reaches the committer,
//     and uses a prefetched record only when writeSeqs holds nothing newer
//     than S for it; otherwise it reads again (pending state first, then
//     the cache, then the engine).
//   - writeSeqs is a table indexed by a hash of the key that keeps the
//     highest group number of any key in its slot: a collision can only
//     make a record look stale, never a stale one look current.
//   - The records of a range read ahead (a DeleteRange's, a compare's or a
//     Range's with a range end) stand for the range only if no group
//     numbered above S wrote a key inside it. The writer keeps the keys of
//     its last pushed groups (writer.recent); a read older than the oldest
//     of them is stale.
//
// A write by anyone but this writer (a deposed leader still committing)
// is not in writeSeqs; the compare-and-swap of every revision key against
// the record the writer used fails such a batch whole, as it always did.

// writeSeqsSize is the number of slots of the table: 2 MiB. A prefetch is
// usually judged a few groups after it was read; with a few thousand keys
// written in between, about 1% of prefetches look stale by collision.
const writeSeqsSize = 1 << 18

// writeSeqs remembers, per hash slot, the number of the last group that
// wrote a key hashing there. Only the writer uses it.
type writeSeqs struct {
	slots []uint64
	mask  uint64
}

func newWriteSeqs(size int) writeSeqs {
	return writeSeqs{slots: make([]uint64, size), mask: uint64(size - 1)}
}

func (t writeSeqs) note(hash, seq uint64) {
	if i := hash & t.mask; t.slots[i] < seq {
		t.slots[i] = seq
	}
}

// since reports whether a group numbered above seq may have written a key
// with this hash.
func (t writeSeqs) since(hash, seq uint64) bool { return t.slots[hash&t.mask] > seq }

// prefetch is what a request's goroutine read for it.
type prefetch struct {
	seq    uint64 // committedSeq before the reads
	recs   []prefetched
	one    [1]prefetched // recs of the usual request, naming one key
	ranges []aheadRange
}

// aheadRange is the revision-key records of one range as read ahead.
type aheadRange struct {
	key, end []byte
	pairs    []kv.Pair
}

// maxRangeRead bounds what a request reads ahead of one range: more is
// left to the writer (a delete of that many keys is rare, and usually too
// large for one commit anyway).
const maxRangeRead = 10000

func (p *prefetch) lookupRange(key, end []byte) (*aheadRange, bool) {
	if p == nil {
		return nil, false
	}
	for i := range p.ranges {
		if r := &p.ranges[i]; bytes.Equal(r.key, key) && bytes.Equal(r.end, end) {
			return r, true
		}
	}
	return nil, false
}

// prefetched is one key's revision-key record as read (found false: none).
// presumed: not read, presumed absent (presume.go).
type prefetched struct {
	key      []byte
	raw      []byte
	found    bool
	presumed bool
}

// lookup returns the record prefetched for key, if any.
func (p *prefetch) lookup(key []byte) (*prefetched, bool) {
	if p == nil {
		return nil, false
	}
	for i := range p.recs {
		if bytes.Equal(p.recs[i].key, key) {
			return &p.recs[i], true
		}
	}
	return nil, false
}

// readAhead reads the records of keys and of the ranges [r[0], r[1]) for a
// request about to be queued. A key or range whose read fails is left out:
// the writer reads it again and reports the failure itself. presume, if not
// nil, is one of keys that is presumed absent unless the latest-record
// cache knows it (presume.go).
// The reads go into p, which is returned (nil when there is nothing to
// read).
func (b *Backend) readAhead(ctx context.Context, p *prefetch, keys [][]byte, ranges [][2][]byte, presume []byte) *prefetch {
	if len(keys) == 0 && len(ranges) == 0 {
		return nil
	}
	p.seq = b.committedSeq.Load()
	for _, r := range ranges {
		start, stop := coder.RevisionRange(r[0], r[1])
		var pairs []kv.Pair
		err := kv.ScanEach(ctx, b.store, kv.ScanOptions{Start: start, End: stop, BatchSize: 1024, Limit: maxRangeRead + 1}, func(kp kv.Pair) error {
			pairs = append(pairs, kp)
			return nil
		})
		if err == nil && len(pairs) <= maxRangeRead {
			p.ranges = append(p.ranges, aheadRange{key: r[0], end: r[1], pairs: pairs})
		}
	}
	if len(keys) <= len(p.one) {
		p.recs = p.one[:0]
	} else {
		p.recs = make([]prefetched, 0, len(keys))
	}
	for _, k := range keys {
		raw, ok, gen := b.cachedRecord(k)
		var err error
		switch {
		case ok:
		case presume != nil && bytes.Equal(k, presume) && b.presume.allow():
			p.recs = append(p.recs, prefetched{key: k, presumed: true})
			continue
		default:
			raw, err = b.storeRecord(ctx, k, gen)
		}
		switch {
		case err == nil:
			p.recs = append(p.recs, prefetched{key: k, raw: raw, found: true})
		case errors.Is(err, kv.ErrNotFound):
			p.recs = append(p.recs, prefetched{key: k})
		}
	}
	return p
}

// txnReads returns what the writer will read for t (both branches, nested
// transactions too): the distinct keys its compares and ops name without a
// range end, which it looks up one by one, and the distinct ranges they
// name (a Range at an explicit revision reads history instead, and none).
func txnReads(t *pb.TxnRequest, keys [][]byte, ranges [][2][]byte) ([][]byte, [][2][]byte) {
	for _, c := range t.Compare {
		keys, ranges = addRead(keys, ranges, c.Key, c.RangeEnd)
	}
	for _, ops := range [2][]*pb.RequestOp{t.Success, t.Failure} {
		for _, op := range ops {
			switch r := op.Request.(type) {
			case *pb.RequestOp_RequestPut:
				keys, ranges = addRead(keys, ranges, r.RequestPut.Key, nil)
			case *pb.RequestOp_RequestDeleteRange:
				keys, ranges = addRead(keys, ranges, r.RequestDeleteRange.Key, r.RequestDeleteRange.RangeEnd)
			case *pb.RequestOp_RequestRange:
				if r.RequestRange.Revision <= 0 {
					keys, ranges = addRead(keys, ranges, r.RequestRange.Key, r.RequestRange.RangeEnd)
				}
			case *pb.RequestOp_RequestTxn:
				keys, ranges = txnReads(r.RequestTxn, keys, ranges)
			}
		}
	}
	return keys, ranges
}

// addRead adds k, or the range [k, end), unless it is there.
func addRead(keys [][]byte, ranges [][2][]byte, k, end []byte) ([][]byte, [][2][]byte) {
	if len(end) != 0 {
		for _, have := range ranges {
			if bytes.Equal(have[0], k) && bytes.Equal(have[1], end) {
				return keys, ranges
			}
		}
		return keys, append(ranges, [2][]byte{k, end})
	}
	for _, have := range keys {
		if bytes.Equal(have, k) {
			return keys, ranges
		}
	}
	return append(keys, k), ranges
}
