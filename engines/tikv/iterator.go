package tikv

import (
	"bytes"
	"context"
	"fmt"

	"github.com/tikv/client-go/v2/txnkv/txnsnapshot"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/batchiter"
)

// How many pairs one TiKV scan request asks for. The caller's BatchSize
// only decides how many pairs one Next returns; client-go's scanner
// buffers a TiKV response and serves several Nexts from it. The request
// size follows the observed size of the pairs instead, because TiKV
// refuses to send a response over its gRPC message limit
// (server.max-grpc-send-msg-len, 10 MiB by default) while values may be
// up to 4 MiB. The estimate comes from pairs already seen, so it holds
// for ranges of similar values (one Kubernetes resource type); a range
// where large values follow many small ones can still produce one
// oversized response (see the README's TiKV settings).
const (
	// initialScanBatch is the size of the first request, before any
	// pair has been seen: two 4 MiB values fit in TiKV's limit. The
	// scan is reopened with a fitting size after the first pair, which
	// costs one small extra request per scan.
	initialScanBatch = 2
	// maxScanBatch is client-go's own default scan batch.
	maxScanBatch = 256
	// targetScanBytes is what one request should carry.
	targetScanBytes = 4 << 20
	// resizeFactor is how far the wanted request size must drift from
	// the current one before the scan is reopened with the new size (a
	// reopen re-fetches what the old request had buffered).
	resizeFactor = 4
)

// scanner is the part of client-go's snapshot iterator the adaptor uses.
type scanner interface {
	Valid() bool
	Key() []byte
	Value() []byte
	Next() error
	Close()
}

// Scan fixes the iterator's snapshot: it fetches a timestamp from PD now,
// so every Commit that returned before Scan is visible and none that
// starts after it is. The TiKV scan itself starts on the first Next.
func (s *Store) Scan(ctx context.Context, opts kv.ScanOptions) (kv.Iterator, error) {
	if err := s.gate.Enter(); err != nil {
		return nil, err
	}
	defer s.gate.Exit()
	sc := &scan{c: cursor{
		reverse: opts.Reverse,
		limit:   opts.Limit,
		lo:      s.dataKey(opts.Start),
		hi:      s.rangeEnd(opts.End),
		strip:   len(s.prefix),
	}}
	c := &sc.c
	if bytes.Compare(c.lo, c.hi) >= 0 {
		sc.Init(&s.gate, nil, opts)
		return sc, nil
	}
	tctx, cancel := s.withTimeout(ctx)
	defer cancel()
	ts, err := s.timestamp(tctx)
	if err != nil {
		return nil, fmt.Errorf("tikv: scan: %w", err)
	}
	c.snap = s.kvs.GetSnapshot(ts)
	sc.Init(&s.gate, c, opts)
	return sc, nil
}

// scan is a scan's iterator and its cursor, allocated together.
type scan struct {
	batchiter.Iterator
	c cursor
}

// cursor is a scan's batchiter.Source: client-go scanners over one
// snapshot, reopened as the pairs' size asks.
type cursor struct {
	snap    *txnsnapshot.KVSnapshot
	lo, hi  []byte // TiKV bounds of the scan, inside the namespace
	strip   int    // the namespace's length, cut from the keys yielded
	reverse bool
	limit   int
	err     error // sticky: a failed TiKV scan is not resumed

	// scan is the open client-go scanner, nil before the first Fill and
	// while a resize is pending; it requests scanBatch pairs at a time.
	scan      scanner
	scanBatch int
	// last is the TiKV key of the last pair yielded, where a reopened
	// scan resumes.
	last []byte
	// pairSize is a moving average of the bytes per pair.
	pairSize int
}

// Fill adds the next pairs, copied out of client-go's buffers.
//
// client-go's scanner does not take a context: a Next blocked on an
// unreachable TiKV ends when client-go's scan backoff budget (20s) runs
// out, not when ctx does. ctx is checked before the scan starts.
func (c *cursor) Fill(b *kv.Batch, yielded int) (bool, error) {
	if c.err != nil {
		return false, c.err
	}
	for !b.Full() {
		if err := c.ensureOpen(yielded + b.Len()); err != nil {
			return false, c.fail(err)
		}
		if !c.scan.Valid() {
			return true, nil
		}
		k := c.scan.Key()
		// The forward scan stops at hi by itself; the reverse one runs
		// towards the start of the keyspace and must be stopped at lo.
		if c.reverse && bytes.Compare(k, c.lo) < 0 {
			return true, nil
		}
		v, err := decodeValue(c.scan.Value())
		if err != nil {
			return false, c.fail(fmt.Errorf("key %q: %w", k, err))
		}
		c.last = append(c.last[:0], k...)
		b.Add(k[c.strip:], v)
		if c.resize(len(k)+len(v), yielded+b.Len()) {
			continue // reopened after this pair by ensureOpen
		}
		if err := c.scan.Next(); err != nil {
			return false, c.fail(err)
		}
	}
	return false, nil
}

// resize folds one pair's size into the average (weight 1/8, so a run
// of large values takes effect within a few pairs). When the request size
// that implies has drifted too far from the current one, it drops the
// scanner before it fetches again and reports true; ensureOpen then
// reopens the scan after the last pair with the new size.
func (c *cursor) resize(size, yielded int) bool {
	if c.pairSize == 0 {
		c.pairSize = size
	} else {
		c.pairSize += (size - c.pairSize) / 8
	}
	want := c.wantBatch(yielded)
	if want*resizeFactor <= c.scanBatch || (want >= resizeFactor*c.scanBatch && c.scanBatch < maxScanBatch) {
		c.scan.Close()
		c.scan = nil
		return true
	}
	return false
}

// wantBatch is the request size for the pairs after the first yielded.
func (c *cursor) wantBatch(yielded int) int {
	want := initialScanBatch
	if c.pairSize > 0 {
		want = targetScanBytes / c.pairSize
	}
	if c.limit > 0 {
		// One more than needed, so that the scanner sees the end of a
		// limited scan without another round trip.
		want = min(want, c.limit-yielded+1)
	}
	// client-go's scanner needs at least 2.
	return min(max(want, 2), maxScanBatch)
}

// ensureOpen opens the scanner if there is none, after the last pair
// yielded (yielded counts the pairs already taken, this batch included).
func (c *cursor) ensureOpen(yielded int) error {
	if c.scan != nil {
		return nil
	}
	c.scanBatch = c.wantBatch(yielded)
	// The snapshot hands its batch size to each scanner it creates.
	c.snap.SetScanBatchSize(c.scanBatch)
	var err error
	switch {
	case c.reverse && c.last != nil:
		c.scan, err = c.snap.IterReverse(c.last) // keys < last
	case c.reverse:
		c.scan, err = c.snap.IterReverse(c.hi)
	case c.last != nil:
		// The first key after last.
		c.scan, err = c.snap.Iter(append(bytes.Clone(c.last), 0), c.hi)
	default:
		c.scan, err = c.snap.Iter(c.lo, c.hi)
	}
	if err != nil {
		c.scan = nil
	}
	return err
}

// fail makes err the scan's answer from now on and drops the scanner.
func (c *cursor) fail(err error) error {
	c.err = fmt.Errorf("tikv: scan: %w", err)
	c.Release()
	return c.err
}

// Release drops the scanner. TiKV holds nothing for a snapshot, so this
// only drops client-go's buffered response.
func (c *cursor) Release() {
	if c.scan != nil {
		c.scan.Close()
		c.scan = nil
	}
	c.snap = nil
}
