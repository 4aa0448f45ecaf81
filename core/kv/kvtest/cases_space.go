package kvtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"

	"github.com/engramkv/engram/core/kv"
)

// spaceValue is the size of the values the space cases write: large enough
// that 64 of them (1 MiB) are data any engine must account for, small
// enough for the value limits of every adaptor.
const spaceValue = 16 << 10

// randomValues returns n incompressible values, as distinct objects are,
// so that a compressing engine cannot make 1 MiB vanish.
func randomValues(t T, n int) [][]byte {
	t.Helper()
	vs := make([][]byte, n)
	for i := range vs {
		vs[i] = make([]byte, spaceValue)
		if _, err := rand.Read(vs[i]); err != nil {
			t.Fatalf("random value: %v", err)
		}
	}
	return vs
}

// caseSize checks kv.Sizer where the store implements it: the size is
// never negative, and writing 1 MiB never makes it shrink. It does not
// insist that the size grows at once: engines report it from statistics
// that may lag (InnoDB's data_length moves when its statistics are
// recomputed, in the background), or, in memory, not at all (badger's
// in-memory mode reports 0). The growth the case saw is logged.
func caseSize(ctx context.Context, t T, s kv.Store) {
	sz, ok := s.(kv.Sizer)
	if !ok {
		t.Skipf("the store is not a kv.Sizer (for a wasm plugin: SIZE is not declared)")
	}
	before, err := sz.Size()
	if err != nil {
		t.Fatalf("Size of an empty store: %v", err)
	}
	if before < 0 {
		t.Fatalf("Size of an empty store = %d, want >= 0", before)
	}
	vs := randomValues(t, 64)
	for i, v := range vs {
		mustCommit(ctx, t, s, kv.Put(key("size/%03d", i), v))
	}
	after, err := sz.Size()
	if err != nil {
		t.Fatalf("Size after writing 1 MiB: %v", err)
	}
	if after < before {
		t.Errorf("Size went from %d to %d bytes while 1 MiB was written; it must not shrink", before, after)
	}
	t.Logf("Size: %d bytes empty, %d after writing 1 MiB of values", before, after)
}

// caseReclaim checks kv.Reclaimer where the store implements it: after
// writes and deletes, Reclaim returns nil, every live key reads back
// exactly, deleted keys stay absent, and a Commit issued while Reclaim runs
// succeeds (Reclaim must not hold commits for its whole run; that the
// commit is not merely queued behind it is each engine's own test).
func caseReclaim(ctx context.Context, t T, s kv.Store) {
	rc, ok := s.(kv.Reclaimer)
	if !ok {
		t.Skipf("the store is not a kv.Reclaimer (for a wasm plugin: RECLAIM is not declared)")
	}
	vs := randomValues(t, 64)
	m := model{}
	for i, v := range vs {
		k := key("reclaim/%03d", i)
		mustCommit(ctx, t, s, kv.Put(k, v))
		m[string(k)] = v
	}
	var ops []kv.Op
	for i := 0; i < len(vs); i += 2 {
		k := key("reclaim/%03d", i)
		ops = append(ops, kv.Delete(k))
		delete(m, string(k))
	}
	mustCommit(ctx, t, s, ops...)

	done := make(chan error, 1)
	go func() { done <- rc.Reclaim(ctx) }()
	during := kv.Put([]byte("reclaim/during"), []byte("committed while reclaiming"))
	if err := s.Commit(ctx, []kv.Op{during}); err != nil {
		t.Errorf("Commit while Reclaim runs: %v", err)
	} else {
		m[string(during.Key)] = during.Value
	}
	if err := <-done; err != nil {
		t.Fatalf("Reclaim: %v", err)
	}

	for i := range vs {
		k := key("reclaim/%03d", i)
		want, live := m[string(k)]
		got, err := s.Get(ctx, k)
		switch {
		case live && err != nil:
			t.Errorf("Get(%s) after Reclaim: %v, want its value", k, err)
		case live && !bytes.Equal(got, want):
			t.Errorf("Get(%s) after Reclaim: a value of %d bytes that differs from the one written", k, len(got))
		case !live && !errors.Is(err, kv.ErrNotFound):
			t.Errorf("Get(%s) of a deleted key after Reclaim: %s, %v; want kv.ErrNotFound", k, show(got), err)
		}
	}
	expectScan(ctx, t, s, kv.ScanOptions{Start: []byte("reclaim/"), End: []byte("reclaim0")}, m.scan(kv.ScanOptions{}))
	if err := rc.Reclaim(ctx); err != nil {
		t.Errorf("a second Reclaim, with nothing left to do: %v", err)
	}
}
