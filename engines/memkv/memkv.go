// Package memkv is an in-memory kv.Store for tests and benchmarks.
//
// It owns nothing but an ordered map held in a persistent (copy-on-write)
// B-tree, internal/btree, which the wasm test plugin wasm/testplugins/memkv
// shares: a Commit changes the tree under a mutex and publishes a frozen
// version of it atomically, so Get never locks and Scan takes an O(1)
// snapshot that later commits cannot disturb. It also answers the optional
// kv.Sizer (the bytes of the keys and values it holds, so the quota guards
// its memory) and kv.Reclaimer (with nothing to give back). It must stay a
// faithful implementation of the kv contract, depending on nothing beyond
// core/kv, internal/btree and engines/internal/batchiter (the iterator the
// compiled-in engines share), because the core's tests and benchmarks use
// it as the reference adaptor; it must not grow durability, eviction or
// any behaviour the contract does not ask for.
package memkv

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/batchiter"
	"github.com/engramkv/engram/internal/btree"
)

// Store is an in-memory kv.Store. The zero value is not usable; call New.
type Store struct {
	// mu serialises commits, which makes Commit trivially atomic and
	// serial, and lets Close wait for the commit in flight. It guards tree.
	mu   sync.Mutex
	tree btree.Tree
	// bytes is what the keys and values held take (Size); written under
	// mu, read without it.
	bytes atomic.Int64
	// published is the tree as of the last commit, frozen: what Get and
	// Scan read without locking.
	published atomic.Pointer[btree.Version]
	closed    atomic.Bool
}

var _ kv.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	s := &Store{}
	s.published.Store(&btree.Version{})
	return s
}

// Features reports memkv's capabilities: none beyond the core, and no
// durability.
func (s *Store) Features() kv.Features {
	return kv.Features{Name: "memkv", Durable: false}
}

// Get returns a copy of key's value, or kv.ErrNotFound.
func (s *Store) Get(ctx context.Context, key []byte) ([]byte, error) {
	if s.closed.Load() {
		return nil, kv.ErrClosed
	}
	v, ok := s.published.Load().Get(key)
	if !ok {
		return nil, kv.ErrNotFound
	}
	// Stored values are shared by every snapshot; the caller gets its own.
	return append([]byte{}, v...), nil
}

// Commit applies ops atomically. Conditions are checked against the state
// left by the previous commit, which is exact because commits are serial.
func (s *Store) Commit(ctx context.Context, ops []kv.Op) error {
	if err := kv.ValidateBatch(ops); err != nil {
		return fmt.Errorf("memkv: commit refused: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memkv: commit not applied: %w", err)
	}
	// Copy the batch before taking the lock: allocation is the costly part
	// and needs no serialisation. Each op gets its own allocation rather
	// than one per batch, so that overwriting one key of a batch frees its
	// memory instead of being pinned by its neighbours.
	items := make([]btree.Item, len(ops))
	for i, op := range ops {
		if op.Kind == kv.OpDelete || op.Kind == kv.OpCompareAndDelete {
			continue
		}
		kl := len(op.Key)
		buf := make([]byte, kl+len(op.Value))
		copy(buf, op.Key)
		copy(buf[kl:], op.Value)
		items[i] = btree.Item{Key: buf[:kl:kl], Value: buf[kl:]}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return kv.ErrClosed
	}
	for i, op := range ops {
		if !op.Kind.Conditional() {
			continue
		}
		if cur, exists := s.tree.Get(op.Key); !op.Holds(cur, exists) {
			return op.Conflict(i, cur, exists)
		}
	}
	var delta int64
	for i, op := range ops {
		var old btree.Item
		var had bool
		switch op.Kind {
		case kv.OpDelete:
			// Deleting an absent key would still copy the path; skip it.
			if _, ok := s.tree.Get(op.Key); ok {
				old, had = s.tree.Delete(op.Key)
			}
		case kv.OpCompareAndDelete:
			old, had = s.tree.Delete(op.Key)
		default:
			old, had = s.tree.Set(items[i].Key, items[i].Value)
			delta += int64(len(items[i].Key) + len(items[i].Value))
		}
		if had {
			delta -= int64(len(old.Key) + len(old.Value))
		}
	}
	s.bytes.Add(delta)
	v := s.tree.Freeze()
	s.published.Store(&v)
	return nil
}

// Scan opens an iterator over the published version. The snapshot is the
// version itself, so it is free to take and never blocks writers.
func (s *Store) Scan(ctx context.Context, opts kv.ScanOptions) (kv.Iterator, error) {
	if s.closed.Load() {
		return nil, kv.ErrClosed
	}
	sc := &scan{c: cursor{reverse: opts.Reverse}}
	c := &sc.c
	if len(opts.End) > 0 {
		c.end = append([]byte{}, opts.End...)
	}
	if len(opts.Start) > 0 {
		c.start = append([]byte{}, opts.Start...)
	}
	if c.end != nil && bytes.Compare(c.start, c.end) >= 0 {
		sc.Init((*readGate)(s), nil, opts)
		return sc, nil
	}
	v := *s.published.Load()
	if opts.Reverse {
		c.cur.SeekLT(v, c.end)
	} else {
		c.cur.SeekGE(v, c.start)
	}
	sc.Init((*readGate)(s), c, opts)
	return sc, nil
}

// scan is a scan's iterator and its cursor, allocated together.
type scan struct {
	batchiter.Iterator
	c cursor
}

// Partitions returns the whole range: memkv does not split, so it does
// not declare the Partitions feature.
func (s *Store) Partitions(ctx context.Context, start, end []byte) ([]kv.Range, error) {
	if s.closed.Load() {
		return nil, kv.ErrClosed
	}
	return []kv.Range{{Start: bytes.Clone(start), End: bytes.Clone(end)}}, nil
}

// Close drops the data. It waits for the commit in flight, if any; commits
// queued behind it then fail with kv.ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Swap(true) {
		return kv.ErrClosed
	}
	s.tree = btree.Tree{}
	s.published.Store(&btree.Version{})
	s.bytes.Store(0)
	return nil
}

// Size is kv.Sizer: the bytes of the keys and values memkv holds, the
// data's share of the process's memory (the tree's nodes and the versions
// open scans still read come on top). It lets the quota and its NOSPACE
// alarm guard memkv's memory as they guard other engines' disks.
func (s *Store) Size() (int64, error) {
	if s.closed.Load() {
		return 0, kv.ErrClosed
	}
	return s.bytes.Load(), nil
}

var _ kv.Sizer = (*Store)(nil)

// readGate is the Store as a batchiter.Gate: a closed store is not read.
// Nothing needs holding off: Close drops the tree, not the versions open
// scans read.
type readGate Store

func (g *readGate) Enter() error {
	if g.closed.Load() {
		return kv.ErrClosed
	}
	return nil
}

func (g *readGate) Exit() {}

// cursor is a scan's batchiter.Source: a cursor over the version that was
// published when the scan began.
type cursor struct {
	cur        btree.Cursor
	start, end []byte
	reverse    bool
}

func (c *cursor) Fill(b *kv.Batch, _ int) (bool, error) {
	for !b.Full() {
		e, ok := c.cur.Next()
		if ok && c.reverse {
			ok = bytes.Compare(e.Key, c.start) >= 0
		} else if ok && c.end != nil {
			ok = bytes.Compare(e.Key, c.end) < 0
		}
		if !ok {
			return true, nil
		}
		b.Add(e.Key, e.Value)
	}
	return false, nil
}

// Release lets the version go.
func (c *cursor) Release() { c.cur.Reset() }
