package badger

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	badgerdb "github.com/dgraph-io/badger/v3"

	"github.com/engramkv/engram/core/kv"
)

// Scan opens an iterator over a read-only transaction, which is the
// snapshot: it is taken here, not on the first Next.
func (s *Store) Scan(ctx context.Context, opts kv.ScanOptions) (kv.Iterator, error) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.usable(); err != nil {
		return nil, err
	}
	it := &iterator{
		store:   s,
		reverse: opts.Reverse,
		limit:   opts.Limit,
		batch:   opts.BatchSize,
		// Copying only the prefix is what makes counting cheap.
		valuePrefix: opts.ValuePrefix,
		start:       dataKey(opts.Start),
	}
	if it.batch <= 0 {
		it.batch = kv.DefaultBatchPairs
	}
	if len(opts.End) > 0 {
		it.end = dataKey(opts.End)
		if bytes.Compare(it.start, it.end) >= 0 {
			it.done = true
			return it, nil
		}
	}
	it.txn = s.db.NewTransaction(false)
	it.iter = it.txn.NewIterator(badgerdb.IteratorOptions{
		// Values are copied one by one into the batch; prefetching would
		// only add goroutines and copies.
		PrefetchValues: false,
		Reverse:        opts.Reverse,
		// Badger leaves out tables whose keys cannot share the prefix, so
		// a scan of one resource's keys merges only the tables that may
		// hold them.
		Prefix: commonPrefix(it.start, it.end),
		// Forward scans see every version, deleted ones included, and
		// stop at End themselves. Without it, badger skips deleted keys
		// inside Next, before the bound can be checked: a scan whose
		// range ends just before a run of deleted keys (a list next to a
		// resource that was just deleted, compaction reading the history
		// of a key next to compacted ones) walked the whole run, tens of
		// thousands of entries, on every call. Reverse scans (a last key,
		// limit 1) keep badger's own version handling.
		AllVersions: !opts.Reverse,
	})
	if opts.Reverse {
		if it.end == nil {
			// Reverse Seek finds the last key <= its argument: the first
			// key past the data namespace lands on the last data key.
			it.iter.Seek([]byte{dataPrefix + 1})
		} else {
			it.iter.Seek(it.end)
			if it.iter.Valid() && bytes.Equal(it.iter.Item().Key(), it.end) {
				it.iter.Next() // End is exclusive
			}
		}
	} else {
		it.iter.Seek(it.start)
	}
	s.itersMu.Lock()
	s.iters[it] = struct{}{}
	s.itersMu.Unlock()
	return it, nil
}

type iterator struct {
	store *Store
	// mu serialises Next and Close, which may race (Close from Store.Close).
	mu         sync.Mutex
	txn        *badgerdb.Txn
	iter       *badgerdb.Iterator
	start, end []byte // in the data namespace; end nil when unbounded
	reverse    bool
	limit      int
	batch      int
	yielded    int
	done       bool
	// valuePrefix > 0 truncates values (kv.ScanOptions.ValuePrefix).
	valuePrefix int
	// lastKey is the key of the previous version a forward scan saw (seen
	// tells an empty key from none).
	lastKey []byte
	seen    bool
}

// commonPrefix is the longest prefix every key in [start, end) shares; with
// no end it is the namespace byte of start.
func commonPrefix(start, end []byte) []byte {
	if end == nil {
		return start[:1:1]
	}
	n := 0
	for n < len(start) && n < len(end) && start[n] == end[n] {
		n++
	}
	return start[:n:n]
}

func (it *iterator) Next(ctx context.Context) ([]kv.Pair, error) {
	s := it.store
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.usable(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.done {
		return nil, nil
	}
	b := kv.NewBatch(kv.BatchWant(kv.ScanOptions{BatchSize: it.batch, Limit: it.limit}, it.yielded))
	for ; !b.Full(); it.iter.Next() {
		if !it.iter.Valid() {
			it.finish()
			break
		}
		item := it.iter.Item()
		k := item.Key()
		if (it.reverse && bytes.Compare(k, it.start) < 0) || (!it.reverse && it.end != nil && bytes.Compare(k, it.end) >= 0) {
			it.finish()
			break
		}
		if !it.reverse {
			// Versions of a key come newest first: the first one decides
			// whether the key exists in this snapshot, the rest are
			// history badger has not compacted away yet.
			if it.seen && bytes.Equal(k, it.lastKey) {
				continue
			}
			it.lastKey = append(it.lastKey[:0], k...)
			it.seen = true
			if item.IsDeletedOrExpired() {
				continue
			}
		}
		k = k[1:] // strip the namespace
		err := item.Value(func(v []byte) error {
			if it.valuePrefix > 0 && len(v) > it.valuePrefix {
				v = v[:it.valuePrefix]
			}
			b.Add(k, v)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("badger: scan: read value of %q: %w", k, err)
		}
	}
	it.yielded += b.Len()
	if it.limit > 0 && it.yielded >= it.limit {
		it.finish()
	}
	return b.Pairs(), nil
}

// finish releases the snapshot; it.mu is held.
func (it *iterator) finish() {
	it.done = true
	if it.txn == nil {
		return
	}
	it.iter.Close()
	it.txn.Discard()
	it.iter, it.txn = nil, nil
	// Unregister last, so Store.Close never closes the database while an
	// iterator it cannot see still holds engine resources.
	s := it.store
	s.itersMu.Lock()
	delete(s.iters, it)
	s.itersMu.Unlock()
}

// Close releases the snapshot. It is safe to call more than once, and
// after the store is closed.
func (it *iterator) Close() error {
	it.mu.Lock()
	defer it.mu.Unlock()
	it.finish()
	return nil
}
