package kvtest

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"

	"github.com/engramkv/engram/core/kv"
)

func caseFeatures(_ context.Context, t T, s kv.Store) {
	if s.Features().Name == "" {
		t.Errorf("Features().Name is empty; the core reports it in Status and metrics")
	}
}

func caseGet(ctx context.Context, t T, s kv.Store) {
	a, b := []byte("a"), []byte("b")
	expectAbsent(ctx, t, s, a)
	mustCommit(ctx, t, s, kv.Put(a, []byte("1")))
	expectValue(ctx, t, s, a, []byte("1"))
	expectAbsent(ctx, t, s, b)
	// A neighbour or a prefix of a present key is not that key.
	expectAbsent(ctx, t, s, []byte("a\x00"))
	expectAbsent(ctx, t, s, []byte("\x00a"))

	mustCommit(ctx, t, s, kv.Put(a, []byte("2")), kv.Put(b, []byte("3")))
	expectValue(ctx, t, s, a, []byte("2"))
	expectValue(ctx, t, s, b, []byte("3"))

	mustCommit(ctx, t, s, kv.Delete(a))
	expectAbsent(ctx, t, s, a)
	expectValue(ctx, t, s, b, []byte("3"))

	// Recreating a deleted key must not resurrect anything of the old one.
	mustCommit(ctx, t, s, kv.Put(a, []byte("4")))
	expectValue(ctx, t, s, a, []byte("4"))
}

func caseEmptyValues(ctx context.Context, t T, s kv.Store) {
	nilV, emptyV := []byte("nil-value"), []byte("empty-value")
	mustCommit(ctx, t, s, kv.Put(nilV, nil), kv.Put(emptyV, []byte{}))
	for _, k := range [][]byte{nilV, emptyV} {
		v, ok := lookup(ctx, t, s, k)
		if !ok {
			t.Errorf("Get(%s): ErrNotFound for a key holding an empty value", show(k))
		} else if len(v) != 0 {
			t.Errorf("Get(%s) = %s, want empty", show(k), show(v))
		}
	}
	expectScan(ctx, t, s, kv.ScanOptions{}, []kv.Pair{{Key: emptyV, Value: nil}, {Key: nilV, Value: nil}})

	// A present empty value is a value: PutIfAbsent must fail, and the
	// conflict must say the key exists with an empty value.
	err := s.Commit(ctx, []kv.Op{kv.PutIfAbsent(nilV, []byte("x"))})
	expectConflict(t, err, 0, nilV, true, nil)
	// Nil and empty compare equal as expected values.
	mustCommit(ctx, t, s, kv.CompareAndSwap(nilV, []byte{}, []byte("x")), kv.CompareAndSwap(emptyV, nil, nil))
	expectValue(ctx, t, s, nilV, []byte("x"))
	expectValue(ctx, t, s, emptyV, nil)
	mustCommit(ctx, t, s, kv.CompareAndDelete(emptyV, nil))
	expectAbsent(ctx, t, s, emptyV)
	// And an absent key does not match an empty expected value.
	err = s.Commit(ctx, []kv.Op{kv.CompareAndSwap(emptyV, nil, []byte("y"))})
	expectConflict(t, err, 0, emptyV, false, nil)
}

// caseCopySemantics checks that neither side can corrupt the other through
// shared buffers: the core reuses its encoding buffers aggressively.
func caseCopySemantics(ctx context.Context, t T, s kv.Store) {
	k := []byte("copy/key")
	v := []byte("value-1")
	mustCommit(ctx, t, s, kv.Put(k, v))
	k[0], v[0] = 'X', 'X'
	expectValue(ctx, t, s, []byte("copy/key"), []byte("value-1"))
	expectAbsent(ctx, t, s, k)

	got, _ := lookup(ctx, t, s, []byte("copy/key"))
	if len(got) > 0 {
		got[0] = 'Y'
	}
	expectValue(ctx, t, s, []byte("copy/key"), []byte("value-1"))

	mustCommit(ctx, t, s, kv.Put([]byte("copy/key2"), []byte("value-2")))
	it, err := s.Scan(ctx, kv.ScanOptions{Start: []byte("copy/"), BatchSize: 1})
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	defer it.Close()
	first, err := it.Next(ctx)
	if err != nil || len(first) == 0 {
		t.Fatalf("Next = %d pairs, %v", len(first), err)
	}
	keep := kv.Pair{Key: append([]byte{}, first[0].Key...), Value: append([]byte{}, first[0].Value...)}
	// Pairs must stay valid across later Next calls and later commits.
	if _, err := drain(ctx, it, kv.ScanOptions{Start: []byte("copy/")}); err != nil {
		t.Fatalf("drain: %v", err)
	}
	mustCommit(ctx, t, s, kv.Put([]byte("copy/key"), []byte("value-3")))
	if !bytes.Equal(first[0].Key, keep.Key) || !bytes.Equal(first[0].Value, keep.Value) {
		t.Errorf("pair returned by Next changed to %s=%s after later calls, was %s=%s",
			show(first[0].Key), show(first[0].Value), show(keep.Key), show(keep.Value))
	}
	// Scribbling on a returned pair must not reach the store.
	first[0].Key[0], first[0].Value[0] = 'Z', 'Z'
	expectValue(ctx, t, s, []byte("copy/key"), []byte("value-3"))
}

// binaryKeys is a set of keys whose byte-wise order differs from what a
// careless engine (string compare, length-first, signed bytes, NUL-terminated
// strings, reserved prefixes) would produce.
func binaryKeys() [][]byte {
	return [][]byte{
		{0x00}, {0x00, 0x00}, {0x00, 0x00, 0x00}, {0x00, 0x01}, {0x00, 0xFF},
		{0x01}, {0x01, 0x00}, {0x7F}, {0x7F, 0xFF}, {0x80}, {0x80, 0x00},
		{0xFE, 0xFF}, {0xFF}, {0xFF, 0x00}, {0xFF, 0xFF}, {0xFF, 0xFF, 0xFF},
		[]byte("a"), []byte("a\x00"), []byte("a\x00\x00"), []byte("a\x00b"), []byte("a\x01"),
		[]byte("aa"), []byte("ab"), []byte("abc"), []byte("abcd"), []byte("abd"),
		[]byte("b"), []byte("B"), []byte("\x00a"), []byte("z\xff"),
		// Engines reserve prefixes for themselves (badger refuses "!badger!").
		[]byte("!badger!"), []byte("!badger!head"), []byte("/registry/pods/a"),
	}
}

func caseByteOrder(ctx context.Context, t T, s kv.Store) {
	keys := binaryKeys()
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	m := model{}
	// Several small batches in shuffled order, so that insertion order
	// cannot accidentally produce the right scan order.
	for i := 0; i < len(keys); i += 5 {
		var ops []kv.Op
		for _, k := range keys[i:min(i+5, len(keys))] {
			ops = append(ops, kv.Put(k, append([]byte("v"), k...)))
		}
		mustCommit(ctx, t, s, ops...)
		m.apply(ops...)
	}
	for _, k := range keys {
		expectValue(ctx, t, s, k, append([]byte("v"), k...))
	}
	for _, rev := range []bool{false, true} {
		for _, bs := range []int{0, 1, 4} {
			o := kv.ScanOptions{Reverse: rev, BatchSize: bs}
			expectScan(ctx, t, s, o, m.scan(o))
		}
		// Bounds on the extremes of the keyspace.
		for _, r := range []kv.Range{
			{Start: []byte{0x00}, End: []byte{0xFF}},
			{Start: []byte{0x00, 0x00}, End: []byte{0xFF, 0xFF}},
			{Start: []byte{0x00, 0x00, 0x00, 0x00}, End: []byte{0xFF, 0xFF, 0xFF, 0xFF}},
			{Start: []byte("a"), End: []byte("a\x00")},
			{Start: []byte("a\x00"), End: []byte("ab")},
			{Start: []byte("ab"), End: []byte("abd")},
			{Start: []byte{0x7F, 0xFF, 0xFF}, End: []byte{0x80, 0x00}},
		} {
			o := kv.ScanOptions{Start: r.Start, End: r.End, Reverse: rev}
			expectScan(ctx, t, s, o, m.scan(o))
		}
	}
}

func caseBatchAtomicity(ctx context.Context, t T, s kv.Store) {
	m := model{}
	base := []kv.Op{
		kv.Put([]byte("atom/present"), []byte("p")),
		kv.Put([]byte("atom/victim"), []byte("v")),
		kv.Put([]byte("atom/cas"), []byte("c")),
	}
	mustCommit(ctx, t, s, base...)
	m.apply(base...)
	want := m.scan(kv.ScanOptions{})

	failing := [][]kv.Op{
		{ // The failing condition comes last, after writes of every kind.
			kv.Put([]byte("atom/new"), []byte("n")),
			kv.Put([]byte("atom/present"), []byte("changed")),
			kv.Delete([]byte("atom/victim")),
			kv.CompareAndSwap([]byte("atom/cas"), []byte("c"), []byte("c2")),
			kv.PutIfAbsent([]byte("atom/present"+"2"), []byte("ok")),
			kv.PutIfAbsent([]byte("atom/cas-other"), []byte("ok")),
			kv.CompareAndDelete([]byte("atom/victim2"), []byte("x")),
		},
		{
			kv.CompareAndDelete([]byte("atom/victim"), []byte("v")),
			kv.PutIfAbsent([]byte("atom/present"), []byte("again")),
		},
		{
			kv.Put([]byte("atom/new"), []byte("n")),
			kv.CompareAndSwap([]byte("atom/cas"), []byte("wrong"), []byte("c3")),
			kv.Delete([]byte("atom/present")),
		},
	}
	for i, ops := range failing {
		err := s.Commit(ctx, ops)
		if _, ok := kv.AsConflict(err); !ok {
			t.Errorf("batch %d: Commit = %v, want a *kv.ConflictError", i, err)
		}
		expectScan(ctx, t, s, kv.ScanOptions{}, want)
	}
	// The same writes without the failing condition all land together.
	ok := failing[0][:len(failing[0])-1]
	mustCommit(ctx, t, s, ok...)
	m.apply(ok...)
	expectScan(ctx, t, s, kv.ScanOptions{}, m.scan(kv.ScanOptions{}))
}

func caseConflicts(ctx context.Context, t T, s kv.Store) {
	present, other := []byte("cond/present"), []byte("cond/other")
	absent := []byte("cond/absent")
	mustCommit(ctx, t, s, kv.Put(present, []byte("cur")), kv.Put(other, []byte("o")))

	cases := []struct {
		name    string
		ops     []kv.Op
		index   int
		key     []byte
		exists  bool
		current []byte
	}{
		{"PutIfAbsent on present", []kv.Op{kv.PutIfAbsent(present, []byte("n"))}, 0, present, true, []byte("cur")},
		{"CAS on absent", []kv.Op{kv.CompareAndSwap(absent, []byte("cur"), []byte("n"))}, 0, absent, false, nil},
		{"CAS on different value", []kv.Op{kv.CompareAndSwap(present, []byte("old"), []byte("n"))}, 0, present, true, []byte("cur")},
		{"CAS expecting a prefix", []kv.Op{kv.CompareAndSwap(present, []byte("cu"), []byte("n"))}, 0, present, true, []byte("cur")},
		{"CAS expecting empty", []kv.Op{kv.CompareAndSwap(present, nil, []byte("n"))}, 0, present, true, []byte("cur")},
		{"CAD on absent", []kv.Op{kv.CompareAndDelete(absent, []byte("cur"))}, 0, absent, false, nil},
		{"CAD on different value", []kv.Op{kv.CompareAndDelete(present, []byte("curr"))}, 0, present, true, []byte("cur")},
		{"index of a later op", []kv.Op{
			kv.Put([]byte("cond/x"), []byte("x")),
			kv.CompareAndSwap(other, []byte("o"), []byte("o2")),
			kv.CompareAndDelete(present, []byte("nope")),
		}, 2, present, true, []byte("cur")},
		{"lowest failing index wins", []kv.Op{
			kv.Delete([]byte("cond/y")),
			kv.PutIfAbsent(other, []byte("o3")),
			kv.CompareAndSwap(absent, []byte("a"), []byte("b")),
			kv.PutIfAbsent(present, []byte("p")),
		}, 1, other, true, []byte("o")},
	}
	for _, c := range cases {
		err := s.Commit(ctx, c.ops)
		if err == nil {
			t.Errorf("%s: Commit succeeded, want a conflict", c.name)
			continue
		}
		t.Logf("%s: %v", c.name, err)
		expectConflict(t, err, c.index, c.key, c.exists, c.current)
	}
	// A conflict may be wrapped with context; AsConflict must still see it,
	// which is the adaptor's side of that bargain: it must not flatten the
	// error into a string.
	expectValue(ctx, t, s, present, []byte("cur"))
	expectValue(ctx, t, s, other, []byte("o"))
	expectAbsent(ctx, t, s, absent)
	expectAbsent(ctx, t, s, []byte("cond/x"))
}

func caseConditionalSuccess(ctx context.Context, t T, s kv.Store) {
	k1, k2, k3 := []byte("ok/1"), []byte("ok/2"), []byte("ok/3")
	mustCommit(ctx, t, s, kv.PutIfAbsent(k1, []byte("a")), kv.PutIfAbsent(k2, []byte("b")))
	expectValue(ctx, t, s, k1, []byte("a"))
	expectValue(ctx, t, s, k2, []byte("b"))

	mustCommit(ctx, t, s,
		kv.CompareAndSwap(k1, []byte("a"), []byte("a2")),
		kv.CompareAndDelete(k2, []byte("b")),
		kv.PutIfAbsent(k3, []byte("c")),
	)
	expectValue(ctx, t, s, k1, []byte("a2"))
	expectAbsent(ctx, t, s, k2)
	expectValue(ctx, t, s, k3, []byte("c"))

	// A key deleted by CompareAndDelete is absent again for PutIfAbsent.
	mustCommit(ctx, t, s, kv.PutIfAbsent(k2, []byte("b2")))
	expectValue(ctx, t, s, k2, []byte("b2"))
	// The old value must no longer match after a swap.
	err := s.Commit(ctx, []kv.Op{kv.CompareAndSwap(k1, []byte("a"), []byte("a3"))})
	expectConflict(t, err, 0, k1, true, []byte("a2"))
	expectScan(ctx, t, s, kv.ScanOptions{Start: []byte("ok/")}, []kv.Pair{
		{Key: k1, Value: []byte("a2")}, {Key: k2, Value: []byte("b2")}, {Key: k3, Value: []byte("c")},
	})
}

func caseDeleteAbsent(ctx context.Context, t T, s kv.Store) {
	mustCommit(ctx, t, s, kv.Delete([]byte("del/never")))
	mustCommit(ctx, t, s, kv.Put([]byte("del/a"), []byte("1")), kv.Delete([]byte("del/b")))
	mustCommit(ctx, t, s, kv.Delete([]byte("del/a")))
	mustCommit(ctx, t, s, kv.Delete([]byte("del/a")))
	expectAbsent(ctx, t, s, []byte("del/a"))
	expectAbsent(ctx, t, s, []byte("del/never"))
	expectScan(ctx, t, s, kv.ScanOptions{}, nil)
	// An empty batch is a no-op, not an error.
	if err := s.Commit(ctx, nil); err != nil {
		t.Errorf("Commit(nil) = %v, want nil", err)
	}
}

func caseInvalidBatches(ctx context.Context, t T, s kv.Store) {
	mustCommit(ctx, t, s, kv.Put([]byte("inv/present"), []byte("p")))
	want := []kv.Pair{{Key: []byte("inv/present"), Value: []byte("p")}}
	bad := map[string][]kv.Op{
		"duplicate key": {
			kv.Put([]byte("inv/a"), []byte("1")),
			kv.Put([]byte("inv/b"), []byte("2")),
			kv.Put([]byte("inv/a"), []byte("3")),
		},
		"duplicate key across kinds": {
			kv.Put([]byte("inv/c"), []byte("1")),
			kv.Delete([]byte("inv/present")),
			kv.CompareAndSwap([]byte("inv/present"), []byte("p"), []byte("q")),
		},
		"empty key":    {kv.Put([]byte("inv/d"), []byte("1")), kv.Put(nil, []byte("2"))},
		"unknown kind": {kv.Put([]byte("inv/e"), []byte("1")), {Kind: kv.OpKind(200), Key: []byte("inv/f")}},
		"key too long": {kv.Put([]byte("inv/g"), []byte("1")), kv.Put(bytes.Repeat([]byte("k"), kv.MaxKeySize+1), nil)},
	}
	for name, ops := range bad {
		err := s.Commit(ctx, ops)
		if err == nil {
			t.Errorf("%s: Commit succeeded, want an error", name)
		} else if _, ok := kv.AsConflict(err); ok {
			t.Errorf("%s: Commit = %v; a malformed batch is not a conflict", name, err)
		} else if errors.Is(err, kv.ErrUncertain) {
			t.Errorf("%s: Commit = %v; a refused batch is certainly not applied", name, err)
		}
		expectScan(ctx, t, s, kv.ScanOptions{}, want)
	}
}
