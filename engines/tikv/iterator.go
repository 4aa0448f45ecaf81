package tikv

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/tikv/client-go/v2/txnkv/txnsnapshot"

	"github.com/engramkv/engram/core/kv"
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
	s.gate.RLock()
	defer s.gate.RUnlock()
	if s.closed {
		return nil, kv.ErrClosed
	}
	it := &iterator{
		store:   s,
		reverse: opts.Reverse,
		limit:   opts.Limit,
		batch:   opts.BatchSize,
		lo:      s.dataKey(opts.Start),
		hi:      s.rangeEnd(opts.End),
	}
	if it.batch <= 0 {
		it.batch = kv.DefaultBatchPairs
	}
	if bytes.Compare(it.lo, it.hi) >= 0 {
		it.done = true
		return it, nil
	}
	tctx, cancel := s.withTimeout(ctx)
	defer cancel()
	ts, err := s.timestamp(tctx)
	if err != nil {
		return nil, fmt.Errorf("tikv: scan: %w", err)
	}
	it.snap = s.kvs.GetSnapshot(ts)
	return it, nil
}

type iterator struct {
	store *Store
	// mu serialises Next and Close.
	mu      sync.Mutex
	snap    *txnsnapshot.KVSnapshot
	lo, hi  []byte // TiKV bounds of the scan, inside the namespace
	reverse bool
	limit   int
	batch   int
	yielded int
	done    bool
	err     error // sticky: a failed TiKV scan is not resumed

	// scan is the open client-go scanner, nil before the first Next and
	// while a resize is pending; it requests scanBatch pairs at a time.
	scan      scanner
	scanBatch int
	// last is the TiKV key of the last pair yielded, where a reopened
	// scan resumes.
	last []byte
	// pairSize is a moving average of the bytes per pair.
	pairSize int
}

// Next returns the next batch, copied out of client-go's buffers.
//
// client-go's scanner does not take a context: a Next blocked on an
// unreachable TiKV ends when client-go's scan backoff budget (20s) runs
// out, not when ctx does. ctx is checked before the scan starts.
func (it *iterator) Next(ctx context.Context) ([]kv.Pair, error) {
	s := it.store
	s.gate.RLock()
	defer s.gate.RUnlock()
	if s.closed {
		return nil, kv.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.err != nil {
		return nil, it.err
	}
	if it.done {
		return nil, nil
	}
	b := kv.NewBatch(kv.BatchWant(kv.ScanOptions{BatchSize: it.batch, Limit: it.limit}, it.yielded))
	strip := len(s.prefix)
	for !b.Full() {
		if err := it.ensureOpen(it.yielded + b.Len()); err != nil {
			return nil, it.fail(err)
		}
		if !it.scan.Valid() {
			it.finish()
			break
		}
		k := it.scan.Key()
		// The forward scan stops at hi by itself; the reverse one runs
		// towards the start of the keyspace and must be stopped at lo.
		if it.reverse && bytes.Compare(k, it.lo) < 0 {
			it.finish()
			break
		}
		v, err := decodeValue(it.scan.Value())
		if err != nil {
			return nil, it.fail(fmt.Errorf("key %q: %w", k, err))
		}
		it.last = append(it.last[:0], k...)
		b.Add(k[strip:], v)
		if it.resize(len(k)+len(v), it.yielded+b.Len()) {
			continue // reopened after this pair by ensureOpen
		}
		if err := it.scan.Next(); err != nil {
			return nil, it.fail(err)
		}
	}
	it.yielded += b.Len()
	if it.limit > 0 && it.yielded >= it.limit {
		it.finish()
	}
	return b.Pairs(), nil
}

// resize folds one pair's size into the average (weight 1/8, so a run
// of large values takes effect within a few pairs). When the request size
// that implies has drifted too far from the current one, it drops the
// scanner before it fetches again and reports true; ensureOpen then
// reopens the scan after the last pair with the new size.
func (it *iterator) resize(size, yielded int) bool {
	if it.pairSize == 0 {
		it.pairSize = size
	} else {
		it.pairSize += (size - it.pairSize) / 8
	}
	want := it.wantBatch(yielded)
	if want*resizeFactor <= it.scanBatch || (want >= resizeFactor*it.scanBatch && it.scanBatch < maxScanBatch) {
		it.scan.Close()
		it.scan = nil
		return true
	}
	return false
}

// wantBatch is the request size for the pairs after the first yielded.
func (it *iterator) wantBatch(yielded int) int {
	want := initialScanBatch
	if it.pairSize > 0 {
		want = targetScanBytes / it.pairSize
	}
	if it.limit > 0 {
		// One more than needed, so that the scanner sees the end of a
		// limited scan without another round trip.
		want = min(want, it.limit-yielded+1)
	}
	// client-go's scanner needs at least 2.
	return min(max(want, 2), maxScanBatch)
}

// ensureOpen opens the scanner if there is none, after the last pair
// yielded (yielded counts the pairs already taken, this batch included).
func (it *iterator) ensureOpen(yielded int) error {
	if it.scan != nil {
		return nil
	}
	it.scanBatch = it.wantBatch(yielded)
	// The snapshot hands its batch size to each scanner it creates.
	it.snap.SetScanBatchSize(it.scanBatch)
	var err error
	switch {
	case it.reverse && it.last != nil:
		it.scan, err = it.snap.IterReverse(it.last) // keys < last
	case it.reverse:
		it.scan, err = it.snap.IterReverse(it.hi)
	case it.last != nil:
		// The first key after last.
		it.scan, err = it.snap.Iter(append(bytes.Clone(it.last), 0), it.hi)
	default:
		it.scan, err = it.snap.Iter(it.lo, it.hi)
	}
	if err != nil {
		it.scan = nil
	}
	return err
}

func (it *iterator) fail(err error) error {
	it.err = fmt.Errorf("tikv: scan: %w", err)
	it.finish()
	return it.err
}

// finish drops the scanner; it.mu is held.
func (it *iterator) finish() {
	it.done = true
	if it.scan != nil {
		it.scan.Close()
		it.scan = nil
	}
	it.snap = nil
}

// Close releases the iterator. TiKV holds nothing for a snapshot, so this
// only drops client-go's buffered response. It is safe to call more than
// once, and after the store is closed.
func (it *iterator) Close() error {
	it.mu.Lock()
	defer it.mu.Unlock()
	it.finish()
	return nil
}
