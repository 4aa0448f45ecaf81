package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
)

// ErrNotEmpty is returned by BulkLoad for a store that holds keys.
var ErrNotEmpty = errors.New("kv: the store is not empty")

// ErrLoading is returned by the calls of a store being bulk-loaded: nothing
// may read or write it until the load finishes or is aborted.
var ErrLoading = errors.New("kv: the store is being bulk-loaded")

// BulkLoader is implemented by adaptors whose engine can fill an empty store
// much faster than Commit can, by writing sorted data straight into its
// files (badger's StreamWriter). It is optional: BulkLoaderOf gives every
// other store the same interface over ordinary batched Commits.
//
// BulkLoad starts a load. It refuses a store holding any key but
// marker.Key with an error wrapping ErrNotEmpty; a store holding the marker
// is an earlier load that did not finish, and BulkLoad discards it. The
// marker is the caller's record that the store is incomplete: from the
// moment BulkLoad returns until Finish returns nil, a crash or an Abort
// leaves a store in which Get(marker.Key) returns marker.Value, with some,
// all or none of the pairs added; Finish deletes the marker in the step
// that makes the load complete and durable. The loaded pairs must not
// include the marker's key.
//
// While a native load runs, the store's other calls may return ErrLoading:
// a store is loaded by one caller, alone.
type BulkLoader interface {
	BulkLoad(ctx context.Context, marker Pair) (Load, error)
}

// Load is one bulk load in progress. It is not safe for concurrent use.
type Load interface {
	// Add loads pairs into stream 0, as AddTo does.
	Add(ctx context.Context, pairs []Pair) error
	// AddTo loads pairs into one of the load's streams, numbered from 0
	// to MaxLoadStreams-1. Within a stream pairs must be in strictly
	// ascending key order, also across calls; the key ranges of the
	// streams must not overlap (Finish fails if they do). A caller whose
	// data comes as several sorted sequences, one per key range, loads
	// each as it comes instead of merging them first; an engine may build
	// each stream's files apart (badger: one StreamWriter stream each).
	// AddTo keeps no reference to the pairs after it returns.
	AddTo(ctx context.Context, stream int, pairs []Pair) error
	// Finish makes everything added durable and visible and deletes the
	// marker.
	Finish(ctx context.Context) error
	// Abort ends an unfinished load, leaving the marker in place; after
	// Finish it does nothing. It is safe to call more than once.
	Abort() error
}

// BulkLoaderOf returns s's own BulkLoader, or one that loads through
// Commits of about batchBytes each (0 means 1 MiB).
func BulkLoaderOf(s Store, batchBytes int) BulkLoader {
	if l, ok := s.(BulkLoader); ok {
		return l
	}
	if batchBytes <= 0 {
		batchBytes = 1 << 20
	}
	return commitLoader{store: s, batchBytes: batchBytes}
}

// commitLoader loads through ordinary Commits: the marker goes first, in
// its own Commit, so a load that stops part-way is marked.
type commitLoader struct {
	store      Store
	batchBytes int
}

func (c commitLoader) BulkLoad(ctx context.Context, marker Pair) (Load, error) {
	if err := clearForLoad(ctx, c.store, marker.Key, c.batchBytes); err != nil {
		return nil, err
	}
	if err := c.store.Commit(ctx, []Op{Put(marker.Key, marker.Value)}); err != nil {
		return nil, fmt.Errorf("kv: bulk load: write the marker: %w", err)
	}
	return &commitLoad{store: c.store, marker: marker.Key, batchBytes: c.batchBytes}, nil
}

// clearForLoad refuses a store holding keys unless one of them is marker,
// in which case it deletes them all, the marker last.
func clearForLoad(ctx context.Context, s Store, marker []byte, batchBytes int) error {
	first, err := firstKeys(ctx, s, nil, 1)
	if err != nil {
		return err
	}
	if len(first) == 0 {
		return nil
	}
	switch _, err := s.Get(ctx, marker); {
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("%w: it holds key %q", ErrNotEmpty, first[0])
	case err != nil:
		return fmt.Errorf("kv: bulk load: read the marker: %w", err)
	}
	for {
		keys, err := firstKeys(ctx, s, nil, 1024)
		if err != nil {
			return err
		}
		var ops []Op
		for _, k := range keys {
			if !bytes.Equal(k, marker) {
				ops = append(ops, Delete(k))
			}
		}
		if len(ops) == 0 {
			break
		}
		if err := commitSplit(ctx, s, ops); err != nil {
			return fmt.Errorf("kv: bulk load: discard the unfinished load: %w", err)
		}
	}
	return nil
}

// firstKeys returns up to n keys from start on.
func firstKeys(ctx context.Context, s Store, start []byte, n int) ([][]byte, error) {
	var keys [][]byte
	err := ScanEach(ctx, s, ScanOptions{Start: start, Limit: n, ValuePrefix: 1}, func(p Pair) error {
		keys = append(keys, p.Key)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kv: bulk load: scan: %w", err)
	}
	return keys, nil
}

// commitSplit commits ops, halving a batch the engine finds too large.
func commitSplit(ctx context.Context, s Store, ops []Op) error {
	err := s.Commit(ctx, ops)
	if errors.Is(err, ErrBatchTooLarge) && len(ops) > 1 {
		half := len(ops) / 2
		if err := commitSplit(ctx, s, ops[:half]); err != nil {
			return err
		}
		return commitSplit(ctx, s, ops[half:])
	}
	return err
}

type commitLoad struct {
	store      Store
	marker     []byte
	batchBytes int
	ops        []Op
	size       int
	order      LoadOrder
	done       bool
}

func (l *commitLoad) Add(ctx context.Context, pairs []Pair) error { return l.AddTo(ctx, 0, pairs) }

func (l *commitLoad) AddTo(ctx context.Context, stream int, pairs []Pair) error {
	if l.done {
		return errors.New("kv: bulk load: Add after Finish or Abort")
	}
	for _, p := range pairs {
		if bytes.Equal(p.Key, l.marker) {
			return fmt.Errorf("kv: bulk load: a pair names the marker key %q", p.Key)
		}
		if err := l.order.Check(stream, p.Key); err != nil {
			return err
		}
		// Copies: the caller may reuse its buffers once Add returns, and
		// the batch is committed later.
		l.ops = append(l.ops, Put(bytes.Clone(p.Key), bytes.Clone(p.Value)))
		l.size += len(p.Key) + len(p.Value) + 16
		if l.size >= l.batchBytes {
			if err := l.flush(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *commitLoad) flush(ctx context.Context) error {
	if len(l.ops) == 0 {
		return nil
	}
	if err := commitSplit(ctx, l.store, l.ops); err != nil {
		return fmt.Errorf("kv: bulk load: commit up to key %q: %w", l.ops[len(l.ops)-1].Key, err)
	}
	clear(l.ops)
	l.ops, l.size = l.ops[:0], 0
	return nil
}

func (l *commitLoad) Finish(ctx context.Context) error {
	if l.done {
		return errors.New("kv: bulk load: Finish after Finish or Abort")
	}
	if err := l.order.Disjoint(); err != nil {
		return err
	}
	if err := l.flush(ctx); err != nil {
		return err
	}
	if err := l.store.Commit(ctx, []Op{Delete(l.marker)}); err != nil {
		return fmt.Errorf("kv: bulk load: delete the marker: %w", err)
	}
	l.done = true
	return nil
}

func (l *commitLoad) Abort() error {
	l.done, l.ops = true, nil
	return nil
}

// MaxLoadStreams bounds a Load's streams.
const MaxLoadStreams = 16

// LoadOrder checks a Load's key order: ascending within each stream,
// streams in disjoint key ranges. Loaders embed it; its zero value is
// ready.
type LoadOrder struct {
	first, last [MaxLoadStreams][]byte
}

// Check accepts key as the next key of stream, or says why not.
func (o *LoadOrder) Check(stream int, key []byte) error {
	if stream < 0 || stream >= MaxLoadStreams {
		return fmt.Errorf("kv: bulk load: stream %d outside [0, %d)", stream, MaxLoadStreams)
	}
	last := o.last[stream]
	if last != nil && bytes.Compare(key, last) <= 0 {
		return fmt.Errorf("kv: bulk load: key %q does not sort after %q in stream %d", key, last, stream)
	}
	if last == nil {
		o.first[stream] = bytes.Clone(key)
	}
	o.last[stream] = append(last[:0], key...)
	return nil
}

// Disjoint says which two streams' key ranges overlap, if any.
func (o *LoadOrder) Disjoint() error {
	var used []int
	for s := range o.first {
		if o.first[s] != nil {
			used = append(used, s)
		}
	}
	slices.SortFunc(used, func(a, b int) int { return bytes.Compare(o.first[a], o.first[b]) })
	for i := 1; i < len(used); i++ {
		a, b := used[i-1], used[i]
		if bytes.Compare(o.last[a], o.first[b]) >= 0 {
			return fmt.Errorf("kv: bulk load: streams %d [%q, %q] and %d [%q, %q] overlap", a, o.first[a], o.last[a], b, o.first[b], o.last[b])
		}
	}
	return nil
}
