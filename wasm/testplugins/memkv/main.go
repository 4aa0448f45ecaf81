// Command memkv is an ordered in-memory key-value store as an Engram
// storage plugin (instance model single: the data lives in the instance's
// linear memory). It keeps its data in a persistent B-tree
// (internal/btree): a scan reads a version of the tree that no later commit
// changes, so it never sees later commits and never blocks them.
//
// It declares ABI 1.1's optional SIZE (the bytes of the keys and values it
// holds) and RECLAIM (it shrinks its hash index after deletes and collects
// garbage), so that the host's paths for both are tested without a database.
//
// It exists to test the host and the SDK with a real, conformant engine and
// to measure the cost of running an engine as wasm against the native
// adaptor (engines/memkv), so it uses the same B-tree, which is tuned for Go
// compiled to wasm, and must stay obviously correct.
package main

import (
	"bytes"
	"context"
	"fmt"
	"runtime"

	"github.com/engramkv/engram/internal/btree"
	"github.com/engramkv/engram/wasm/sdk"
)

func main() { sdk.Serve(&store{}) }

type store struct {
	t   btree.Tree
	idx index // the latest value of every key, for Get and conditions
	// pairs is the batch buffer every iterator returns: the SDK copies
	// a batch into its response before the next call, and an iterator
	// allocating its own (1024 pairs: 48 KiB) per scan made the guest
	// collect garbage several times as often.
	pairs []sdk.Pair
	// bytes counts the keys and values held, for Size.
	bytes int64
	// reclaims counts Reclaim calls, logged so that a test can see that
	// the host's defragment reached the plugin.
	reclaims int
}

func (s *store) Init(_ context.Context, config []byte, _ sdk.HostInfo) (sdk.Manifest, error) {
	if len(bytes.TrimSpace(config)) != 0 {
		return sdk.Manifest{}, fmt.Errorf("%w: memkv takes no configuration, got %q", sdk.ErrInvalid, config)
	}
	s.t, s.idx, s.bytes = btree.Tree{}, index{}, 0
	return sdk.Manifest{Name: "memkv-wasm", Version: "1.1.0", Model: sdk.ModelSingle}, nil
}

func (s *store) Get(_ context.Context, key []byte) ([]byte, error) {
	v, ok := s.idx.get(key)
	if !ok {
		return nil, sdk.ErrNotFound
	}
	return v, nil
}

func (s *store) Commit(_ context.Context, ops []sdk.Op) error {
	// Check every condition before writing anything: all or nothing.
	for i := range ops {
		op := &ops[i]
		if op.Kind == sdk.OpPut || op.Kind == sdk.OpDelete {
			continue
		}
		cur, exists := s.idx.get(op.Key)
		var ok bool
		switch op.Kind {
		case sdk.OpPutIfAbsent:
			ok = !exists
		default: // CompareAndSwap, CompareAndDelete
			ok = exists && btree.Equal(cur, op.Expected)
		}
		if !ok {
			return &sdk.ConflictError{Index: i, Exists: exists, Current: cur}
		}
	}
	for i := range ops {
		op := &ops[i]
		switch op.Kind {
		case sdk.OpPut, sdk.OpPutIfAbsent, sdk.OpCompareAndSwap:
			// The request buffer is reused: keep a copy, key and value
			// in one allocation, as allocations are costly in wasm
			// (DESIGN.md, "The in-memory tree in wasm").
			kl := len(op.Key)
			buf := make([]byte, kl+len(op.Value))
			copy(buf, op.Key)
			copy(buf[kl:], op.Value)
			key, value := buf[:kl:kl], buf[kl:]
			s.t.Set(key, value)
			s.bytes += int64(len(buf) - s.idx.set(key, value))
		case sdk.OpDelete:
			// Deleting an absent key would still copy the path; skip it.
			if s.forget(op.Key) {
				s.t.Delete(op.Key)
				s.idx.remove(op.Key)
			}
		case sdk.OpCompareAndDelete:
			s.forget(op.Key)
			s.t.Delete(op.Key)
			s.idx.remove(op.Key)
		}
	}
	return nil
}

// forget takes key's current pair, if any, out of the byte count, and
// reports whether the key exists.
func (s *store) forget(key []byte) bool {
	v, ok := s.idx.get(key)
	if ok {
		s.bytes -= int64(len(key) + len(v))
	}
	return ok
}

// Size is the bytes of the keys and values held: what a client's data
// takes, not the tree's and the index's overhead.
func (s *store) Size(context.Context) (int64, error) { return s.bytes, nil }

// Reclaim shrinks the index where deletes left it sparse and lets the Go
// runtime collect what that and the deletes freed, for reuse: wasm linear
// memory never shrinks, so nothing goes back to the host.
func (s *store) Reclaim(context.Context) error {
	before, after := s.idx.shrink()
	runtime.GC()
	s.reclaims++
	sdk.Logger().Info("memkv reclaimed", "reclaims", s.reclaims, "index_slots_before", before, "index_slots_after", after)
	return nil
}

func (s *store) Scan(_ context.Context, opts sdk.ScanOptions) (sdk.Iterator, error) {
	// The iterator holds its cursor's path (deep enough for billions of
	// keys) and both bounds share one buffer: allocations are most of
	// what a short scan costs in wasm.
	it := &iter{s: s, reverse: opts.Reverse}
	ls := len(opts.Start)
	bounds := make([]byte, ls+len(opts.End))
	copy(bounds, opts.Start)
	copy(bounds[ls:], opts.End)
	it.start, it.end = bounds[:ls:ls], bounds[ls:]
	it.version, it.open = s.t.Read(), true
	if opts.Reverse {
		it.cur.SeekLT(it.version, it.end)
	} else {
		it.cur.SeekGE(it.version, it.start)
	}
	return it, nil
}

// Partitions splits a range every partSize keys, so the host's PARTITIONS
// path is exercised with more than one range.
func (s *store) Partitions(_ context.Context, start, end []byte, max int) ([]sdk.Range, error) {
	const partSize = 512
	var cuts [][]byte
	v := s.t.Read()
	defer s.t.Release(v)
	var c btree.Cursor
	c.SeekGE(v, start)
	for n := 0; ; n++ {
		it, ok := c.Next()
		if !ok || len(end) > 0 && btree.Compare(it.Key, end) >= 0 {
			break
		}
		if n > 0 && n%partSize == 0 && (max <= 0 || len(cuts)+1 < max) {
			cuts = append(cuts, bytes.Clone(it.Key))
		}
	}
	out := make([]sdk.Range, 0, len(cuts)+1)
	from := start
	for _, c := range cuts {
		out = append(out, sdk.Range{Start: from, End: c})
		from = c
	}
	return append(out, sdk.Range{Start: from, End: end}), nil
}

func (s *store) Close(context.Context) error {
	s.t, s.idx, s.bytes = btree.Tree{}, index{}, 0
	return nil
}

// iter walks a version of the tree with a cursor.
type iter struct {
	s          *store
	version    btree.Version // the version it reads
	open       bool          // version not released yet
	cur        btree.Cursor
	start, end []byte
	reverse    bool
	done       bool
}

func (it *iter) Next(_ context.Context, max int) ([]sdk.Pair, error) {
	buf := it.s.pairs[:0]
	for !it.done && len(buf) < max {
		run, past := it.cur.NextRun(max-len(buf), it.end)
		for i := range run {
			buf = append(buf, sdk.Pair{Key: run[i].Key, Value: run[i].Value})
		}
		if past {
			it.Close()
			break
		}
		if len(run) > 0 {
			continue
		}
		x, ok := it.cur.Next()
		if ok && it.reverse {
			ok = btree.Compare(x.Key, it.start) >= 0
		} else if ok && len(it.end) > 0 {
			ok = btree.Compare(x.Key, it.end) < 0
		}
		if !ok {
			it.Close()
			break
		}
		buf = append(buf, sdk.Pair{Key: x.Key, Value: x.Value})
	}
	it.s.pairs = buf
	return buf, nil
}

// Close lets the snapshot go.
func (it *iter) Close() error {
	it.done = true
	it.cur.Reset()
	if it.open {
		it.open = false
		it.s.t.Release(it.version)
	}
	return nil
}
