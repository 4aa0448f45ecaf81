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
	if s.closed {
		return nil, kv.ErrClosed
	}
	it := &iterator{
		store:   s,
		reverse: opts.Reverse,
		limit:   opts.Limit,
		batch:   opts.BatchSize,
		start:   dataKey(opts.Start),
	}
	if it.batch <= 0 {
		it.batch = defaultBatchSize
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
		Prefix:         []byte{dataPrefix},
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
}

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
	if it.done {
		return nil, nil
	}
	n := it.batch
	if it.limit > 0 {
		n = min(n, it.limit-it.yielded)
	}
	pairs := make([]kv.Pair, 0, min(n, defaultBatchSize))
	var arena []byte
	size := 0
	for ; len(pairs) < n && size < maxBatchBytes; it.iter.Next() {
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
		k = k[1:] // strip the namespace
		need := len(k) + int(item.ValueSize())
		if cap(arena)-len(arena) < need {
			arena = make([]byte, 0, max(need, min(arenaChunk, need*(n-len(pairs)))))
		}
		off := len(arena)
		arena = append(arena, k...)
		kEnd := len(arena)
		err := item.Value(func(v []byte) error {
			arena = append(arena, v...)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("badger: scan: read value of %q: %w", k, err)
		}
		// Full slice expressions keep a caller's append from running into
		// the neighbouring pair.
		pairs = append(pairs, kv.Pair{Key: arena[off:kEnd:kEnd], Value: arena[kEnd:len(arena):len(arena)]})
		size += len(arena) - off
	}
	it.yielded += len(pairs)
	if it.limit > 0 && it.yielded >= it.limit {
		it.finish()
	}
	return pairs, nil
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
