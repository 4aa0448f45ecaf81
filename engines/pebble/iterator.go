package pebble

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/engramkv/engram/core/kv"
)

// Scan opens a pebble iterator, which is the snapshot: it reads at the
// sequence number current here, not at the first Next.
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
		// Copying only the prefix is what makes counting cheap.
		valuePrefix: opts.ValuePrefix,
	}
	if it.batch <= 0 {
		it.batch = kv.DefaultBatchPairs
	}
	iopts := &pebbledb.IterOptions{LowerBound: clone(opts.Start)}
	if len(opts.End) > 0 {
		if opts.Start != nil && bytes.Compare(opts.Start, opts.End) >= 0 {
			it.done = true
			return it, nil
		}
		// Bounds let pebble skip tables outside the range and stop at the
		// end by itself, also in the middle of a run of deleted keys.
		iopts.UpperBound = clone(opts.End)
	}
	iter, err := s.db.NewIter(iopts)
	if err != nil {
		return nil, fmt.Errorf("pebble: scan: %w", err)
	}
	it.iter = iter
	s.itersMu.Lock()
	s.iters[it] = struct{}{}
	s.itersMu.Unlock()
	return it, nil
}

type iterator struct {
	store *Store
	// mu serialises Next and Close, which may race (Close from Store.Close).
	mu         sync.Mutex
	iter       *pebbledb.Iterator
	positioned bool // the first Next has placed iter on the first pair
	reverse    bool
	limit      int
	batch      int
	yielded    int
	done       bool
	// valuePrefix > 0 truncates values (kv.ScanOptions.ValuePrefix).
	valuePrefix int
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
	b := kv.NewBatch(kv.BatchWant(kv.ScanOptions{BatchSize: it.batch, Limit: it.limit}, it.yielded))
	valid := it.step()
	for ; valid; valid = it.step() {
		v, err := it.iter.ValueAndErr()
		if err != nil {
			return nil, fmt.Errorf("pebble: scan: read value of %q: %w", it.iter.Key(), err)
		}
		if it.valuePrefix > 0 && len(v) > it.valuePrefix {
			v = v[:it.valuePrefix]
		}
		b.Add(it.iter.Key(), v)
		if b.Full() {
			break
		}
	}
	if !valid {
		if err := it.iter.Error(); err != nil {
			return nil, fmt.Errorf("pebble: scan: %w", err)
		}
		it.finish()
	}
	it.yielded += b.Len()
	if it.limit > 0 && it.yielded >= it.limit {
		it.finish()
	}
	return b.Pairs(), nil
}

// step moves to the next pair in the scan's direction (the first on the
// first call) and reports whether there is one.
func (it *iterator) step() bool {
	if !it.positioned {
		it.positioned = true
		if it.reverse {
			return it.iter.Last()
		}
		return it.iter.First()
	}
	if it.reverse {
		return it.iter.Prev()
	}
	return it.iter.Next()
}

// finish releases the snapshot; it.mu is held.
func (it *iterator) finish() {
	it.done = true
	if it.iter == nil {
		return
	}
	if err := it.iter.Close(); err != nil {
		it.store.log.Warn("closing an iterator", "err", err)
	}
	it.iter = nil
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
