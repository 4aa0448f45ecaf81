// Command memkv is an ordered in-memory key-value store as an Engram
// storage plugin (instance model single: the data lives in the instance's
// linear memory). Scans read copy-on-write snapshots of a B-tree, so an open
// scan never sees later commits and never blocks them.
//
// It exists to test the host and the SDK with a real, conformant engine and
// to measure the cost of running an engine as wasm; it must stay simple and
// obviously correct rather than fast.
package main

import (
	"bytes"
	"context"
	"fmt"

	"github.com/google/btree"

	"github.com/engramkv/engram/sdk"
)

func main() { sdk.Serve(&store{}) }

type item struct{ k, v []byte }

func less(a, b item) bool { return bytes.Compare(a.k, b.k) < 0 }

type store struct {
	t *btree.BTreeG[item]
}

func (s *store) Init(_ context.Context, config []byte, _ sdk.HostInfo) (sdk.Manifest, error) {
	if len(bytes.TrimSpace(config)) != 0 {
		return sdk.Manifest{}, fmt.Errorf("%w: memkv takes no configuration, got %q", sdk.ErrInvalid, config)
	}
	s.t = btree.NewG[item](32, less)
	return sdk.Manifest{Name: "memkv-wasm", Version: "1.0.0", Model: sdk.ModelSingle}, nil
}

func (s *store) Get(_ context.Context, key []byte) ([]byte, error) {
	it, ok := s.t.Get(item{k: key})
	if !ok {
		return nil, sdk.ErrNotFound
	}
	return it.v, nil
}

func (s *store) Commit(_ context.Context, ops []sdk.Op) error {
	// Check every condition before writing anything: all or nothing.
	for i, op := range ops {
		cur, exists := s.t.Get(item{k: op.Key})
		ok := true
		switch op.Kind {
		case sdk.OpPutIfAbsent:
			ok = !exists
		case sdk.OpCompareAndSwap, sdk.OpCompareAndDelete:
			ok = exists && bytes.Equal(cur.v, op.Expected)
		}
		if !ok {
			return &sdk.ConflictError{Index: i, Exists: exists, Current: cur.v}
		}
	}
	for _, op := range ops {
		switch op.Kind {
		case sdk.OpPut, sdk.OpPutIfAbsent, sdk.OpCompareAndSwap:
			// The request buffer is reused: keep copies.
			s.t.ReplaceOrInsert(item{k: bytes.Clone(op.Key), v: append([]byte{}, op.Value...)})
		case sdk.OpDelete, sdk.OpCompareAndDelete:
			s.t.Delete(item{k: op.Key})
		}
	}
	return nil
}

func (s *store) Scan(_ context.Context, opts sdk.ScanOptions) (sdk.Iterator, error) {
	return &iter{t: s.t.Clone(), start: bytes.Clone(opts.Start), end: bytes.Clone(opts.End), reverse: opts.Reverse}, nil
}

// Partitions splits a range every partSize keys, so the host's PARTITIONS
// path is exercised with more than one range.
func (s *store) Partitions(_ context.Context, start, end []byte, max int) ([]sdk.Range, error) {
	const partSize = 512
	var cuts [][]byte
	n := 0
	s.t.AscendGreaterOrEqual(item{k: start}, func(it item) bool {
		if len(end) > 0 && bytes.Compare(it.k, end) >= 0 {
			return false
		}
		if n > 0 && n%partSize == 0 && (max <= 0 || len(cuts)+1 < max) {
			cuts = append(cuts, bytes.Clone(it.k))
		}
		n++
		return true
	})
	out := make([]sdk.Range, 0, len(cuts)+1)
	from := start
	for _, c := range cuts {
		out = append(out, sdk.Range{Start: from, End: c})
		from = c
	}
	return append(out, sdk.Range{Start: from, End: end}), nil
}

func (s *store) Close(context.Context) error {
	s.t = nil
	return nil
}

// iter walks a snapshot, resuming after the last key it yielded.
type iter struct {
	t          *btree.BTreeG[item]
	start, end []byte
	reverse    bool
	last       []byte
	started    bool
	buf        []sdk.Pair
}

func (it *iter) Next(_ context.Context, max int) ([]sdk.Pair, error) {
	if it.t == nil {
		return nil, nil
	}
	it.buf = it.buf[:0]
	visit := func(x item) bool {
		if it.started && bytes.Equal(x.k, it.last) {
			return true
		}
		if !it.reverse && len(it.end) > 0 && bytes.Compare(x.k, it.end) >= 0 {
			return false
		}
		if it.reverse && bytes.Compare(x.k, it.start) < 0 {
			return false
		}
		if it.reverse && !it.started && len(it.end) > 0 && bytes.Compare(x.k, it.end) >= 0 {
			return true
		}
		it.buf = append(it.buf, sdk.Pair{Key: x.k, Value: x.v})
		return len(it.buf) < max
	}
	switch {
	case !it.reverse && !it.started:
		it.t.AscendGreaterOrEqual(item{k: it.start}, visit)
	case !it.reverse:
		it.t.AscendGreaterOrEqual(item{k: it.last}, visit)
	case !it.started && len(it.end) == 0:
		it.t.Descend(visit)
	case !it.started:
		it.t.DescendLessOrEqual(item{k: it.end}, visit)
	default:
		it.t.DescendLessOrEqual(item{k: it.last}, visit)
	}
	if len(it.buf) > 0 {
		it.last = it.buf[len(it.buf)-1].Key
		it.started = true
	}
	return it.buf, nil
}

func (it *iter) Close() error {
	it.t = nil
	return nil
}
