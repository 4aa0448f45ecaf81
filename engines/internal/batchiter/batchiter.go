// Package batchiter is the kv.Iterator of the compiled-in engines. It owns
// what the contract asks of every iterator alike: batches of BatchSize pairs
// (kv.DefaultBatchPairs when unset), Limit over the whole scan, nothing
// after the end, a Close that is safe to call more than once and against a
// concurrent Next, and the set of a store's open iterators that the store's
// Close closes before it closes its engine.
//
// It must not know any engine: reading pairs from the engine's snapshot is
// the engine's Source, and whether the store may be read is its Gate.
package batchiter

import (
	"context"
	"sync"

	"github.com/engramkv/engram/core/kv"
)

// Source is an engine's cursor over one scan's snapshot.
type Source interface {
	// Fill adds the scan's next pairs to b until b is full or the range
	// ends, and reports whether it ended. yielded counts the pairs the
	// earlier batches returned. An error leaves the scan open: the next
	// Next calls Fill again.
	Fill(b *kv.Batch, yielded int) (end bool, err error)
	// Release lets the snapshot go. It is called once, when the scan ends
	// or is closed, never during a Fill.
	Release()
}

// Gate is a store's check that it may be read now.
type Gate interface {
	// Enter returns nil if the store may be read until Exit (holding off
	// its Close), or the reason it may not (kv.ErrClosed).
	Enter() error
	// Exit ends what a successful Enter began.
	Exit()
}

// Iterator is a kv.Iterator over a Source.
type Iterator struct {
	gate Gate
	// mu serialises Next and Close, which may race (Close from the
	// store's Close).
	mu      sync.Mutex
	src     Source // nil once released
	open    *Open  // where the iterator is registered, if anywhere
	limit   int
	batch   int
	yielded int
	done    bool
	// page is the batch Next is filling. It lives here, not on Next's
	// stack, because a *kv.Batch handed to an interface method escapes:
	// a fresh one would cost an allocation per Next.
	page kv.Batch
}

var _ kv.Iterator = (*Iterator)(nil)

// New returns an iterator over src with opts' Limit and BatchSize. A nil
// src is an empty scan (a range whose start is not before its end).
func New(gate Gate, src Source, opts kv.ScanOptions) *Iterator {
	it := new(Iterator)
	it.Init(gate, src, opts)
	return it
}

// Init is New in place, for an engine that allocates the Iterator together
// with its Source: one allocation per scan instead of two.
func (it *Iterator) Init(gate Gate, src Source, opts kv.ScanOptions) {
	it.gate, it.src, it.limit, it.batch = gate, src, opts.Limit, opts.BatchSize
	if it.batch <= 0 {
		it.batch = kv.DefaultBatchPairs
	}
	it.done = src == nil
}

// Next returns the next batch of at most BatchSize pairs; an empty one
// once the scan is complete.
func (it *Iterator) Next(ctx context.Context) ([]kv.Pair, error) {
	if err := it.gate.Enter(); err != nil {
		return nil, err
	}
	defer it.gate.Exit()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.done {
		return nil, nil
	}
	it.page = *kv.NewBatch(kv.BatchWant(kv.ScanOptions{BatchSize: it.batch, Limit: it.limit}, it.yielded))
	end, err := it.src.Fill(&it.page, it.yielded)
	pairs := it.page.Pairs()
	it.page = kv.Batch{} // the pairs are the caller's: keep no reference to them
	if err != nil {
		return nil, err
	}
	if end {
		it.finish()
	}
	it.yielded += len(pairs)
	if it.limit > 0 && it.yielded >= it.limit {
		it.finish()
	}
	return pairs, nil
}

// Close releases the snapshot. It is safe to call more than once, and
// after the store is closed.
func (it *Iterator) Close() error {
	it.mu.Lock()
	defer it.mu.Unlock()
	it.finish()
	return nil
}

// finish ends the scan and releases the snapshot; it.mu is held.
func (it *Iterator) finish() {
	it.done = true
	if it.src == nil {
		return
	}
	it.src.Release()
	it.src = nil
	// Unregister last, so the store's Close never closes the engine while
	// an iterator it cannot see still holds engine resources.
	if it.open != nil {
		it.open.remove(it)
	}
}

// Open is the set of a store's open iterators. Its zero value is empty and
// ready to use.
type Open struct {
	mu  sync.Mutex
	its map[*Iterator]struct{}
}

// Add registers it until its scan ends or it is closed. The caller holds
// off the store's Close while it adds (a Gate's Enter).
func (o *Open) Add(it *Iterator) {
	if it.done {
		return // holds nothing
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.its == nil {
		o.its = make(map[*Iterator]struct{})
	}
	it.open = o
	o.its[it] = struct{}{}
}

func (o *Open) remove(it *Iterator) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.its, it)
}

// CloseAll closes every registered iterator, for the store's Close.
func (o *Open) CloseAll() {
	o.mu.Lock()
	open := make([]*Iterator, 0, len(o.its))
	for it := range o.its {
		open = append(open, it)
	}
	o.mu.Unlock()
	// Outside o.mu: an iterator's Close takes its own lock, then o.mu.
	for _, it := range open {
		it.Close()
	}
}
