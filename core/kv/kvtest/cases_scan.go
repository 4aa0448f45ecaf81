package kvtest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/engramkv/engram/core/kv"
)

func caseScanBounds(ctx context.Context, t T, s kv.Store) {
	m := model{}
	for i := 0; i < 40; i += 2 {
		m[fmt.Sprintf("r/%02d", i)] = key("v%d", i)
	}
	// Neighbours outside the probed prefix catch scans that leak past bounds.
	m["q"] = []byte("before")
	m["r0"] = []byte("after")
	load(ctx, t, s, m, 7)

	// Bounds hit keys exactly, fall between keys, sit outside all keys, and
	// are prefixes of keys.
	bounds := [][]byte{
		nil, []byte("r/"), []byte("r/00"), []byte("r/01"), []byte("r/1"), []byte("r/10"),
		[]byte("r/10\x00"), []byte("r/37"), []byte("r/38"), []byte("r/99"), []byte("r0"), []byte("s"),
	}
	limits := []int{0, 1, 3, 10, 19, 20, 21, 100}
	n := 0
	for _, start := range bounds {
		for _, end := range bounds {
			for _, rev := range []bool{false, true} {
				for li, limit := range limits {
					o := kv.ScanOptions{
						Start: start, End: end, Reverse: rev, Limit: limit,
						BatchSize: []int{0, 1, 2, 5, 1000}[(n+li)%5],
					}
					n++
					got := scanAll(ctx, t, s, o)
					if diff := diffPairs(got, m.scan(o)); diff != "" {
						t.Fatalf("Scan%s: %s\n got: %s\nwant: %s", showOpts(o), diff, showPairs(got), showPairs(m.scan(o)))
					}
				}
			}
		}
	}
	// An empty, non-nil End is "no upper bound" too.
	o := kv.ScanOptions{Start: []byte("r/30"), End: []byte{}}
	expectScan(ctx, t, s, o, m.scan(kv.ScanOptions{Start: o.Start}))
	o.Reverse = true
	expectScan(ctx, t, s, o, m.scan(kv.ScanOptions{Start: o.Start, Reverse: true}))
}

func caseEmptyRanges(ctx context.Context, t T, s kv.Store) {
	// An empty store first: nothing anywhere, in either direction.
	for _, rev := range []bool{false, true} {
		expectScan(ctx, t, s, kv.ScanOptions{Reverse: rev}, nil)
		expectScan(ctx, t, s, kv.ScanOptions{Start: []byte("a"), End: []byte("z"), Reverse: rev, Limit: 5}, nil)
	}
	m := model{"e/a": []byte("1"), "e/b": []byte("2"), "e/c": []byte("3")}
	load(ctx, t, s, m, 10)
	for _, r := range []kv.Range{
		{Start: []byte("e/b"), End: []byte("e/b")},     // start == end, on a key
		{Start: []byte("e/bb"), End: []byte("e/bb")},   // start == end, between keys
		{Start: []byte("e/c"), End: []byte("e/a")},     // start > end
		{Start: []byte("e/b\x00"), End: []byte("e/b")}, // start just above end
		{Start: []byte("e/a\x00"), End: []byte("e/b")}, // between two adjacent keys
		{Start: []byte("f"), End: nil},                 // past the last key
		{Start: nil, End: []byte("e/a")},               // before the first key
		{Start: []byte{0xFF, 0xFF}, End: []byte{0x00}}, // inverted extremes
	} {
		for _, rev := range []bool{false, true} {
			for _, limit := range []int{0, 1} {
				expectScan(ctx, t, s, kv.ScanOptions{Start: r.Start, End: r.End, Reverse: rev, Limit: limit}, nil)
			}
		}
	}
}

func caseMultiBatch(ctx context.Context, t T, s kv.Store) {
	const n = 5000
	m := make(model, n)
	for i := range n {
		m[fmt.Sprintf("mb/%06d", i)] = key("value-%d", i)
	}
	load(ctx, t, s, m, 500)
	all := m.scan(kv.ScanOptions{})
	for _, rev := range []bool{false, true} {
		for _, bs := range []int{0, 1, 7, 1000, n, 3 * n} {
			for _, limit := range []int{0, 1, n / 2, n - 1, n, n + 1} {
				if bs == 1 && limit != n/2 {
					continue // one pair per Next is slow; one probe is enough.
				}
				o := kv.ScanOptions{Reverse: rev, BatchSize: bs, Limit: limit}
				expectScan(ctx, t, s, o, m.scan(o))
			}
		}
		// A huge range around everything, bounded by keys no adaptor could
		// store, still returns exactly the data.
		o := kv.ScanOptions{Start: []byte{0x00}, End: bytes.Repeat([]byte{0xFF}, kv.MaxKeySize+1), Reverse: rev}
		expectScan(ctx, t, s, o, m.scan(o))
	}
	// Pick random windows in the middle of a multi-batch scan.
	rng := rand.New(rand.NewPCG(7, 7))
	for range 20 {
		a, b := rng.IntN(n), rng.IntN(n)
		o := kv.ScanOptions{
			Start:     all[min(a, b)].Key,
			End:       all[max(a, b)].Key,
			Reverse:   rng.IntN(2) == 0,
			Limit:     rng.IntN(n),
			BatchSize: 1 + rng.IntN(300),
		}
		expectScan(ctx, t, s, o, m.scan(o))
	}
}

func (cfg Config) caseLarge(ctx context.Context, t T, s kv.Store) {
	rng := rand.New(rand.NewPCG(3, 4))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	maxV := random(cfg.MaxValueSize)
	mib := random(min(1<<20+1, cfg.MaxValueSize))
	longA := bytes.Repeat([]byte{0xFF}, cfg.MaxKeySize)
	longB := append(bytes.Repeat([]byte{0xFF}, cfg.MaxKeySize-1), 0x00)
	longC := append(bytes.Repeat([]byte{0xFF}, cfg.MaxKeySize/2), random(cfg.MaxKeySize/2)...)
	m := model{}
	ops := []kv.Op{
		kv.Put([]byte("large/max"), maxV),
		kv.Put([]byte("large/mib"), mib),
		kv.Put(longA, []byte("A")),
		kv.Put(longB, mib[:1000]),
		kv.Put(longC, []byte("C")),
		kv.Put([]byte("large/small"), []byte("s")),
	}
	mustCommit(ctx, t, s, ops...)
	m.apply(ops...)
	for _, op := range ops {
		expectValue(ctx, t, s, op.Key, op.Value)
	}
	for _, rev := range []bool{false, true} {
		for _, bs := range []int{0, 1} {
			o := kv.ScanOptions{Reverse: rev, BatchSize: bs}
			expectScan(ctx, t, s, o, m.scan(o))
		}
		o := kv.ScanOptions{Start: longB, End: longA, Reverse: rev}
		expectScan(ctx, t, s, o, m.scan(o))
	}

	// Conditions compare whole large values, and conflicts carry them back.
	other := append(append([]byte{}, maxV[:len(maxV)-1]...), maxV[len(maxV)-1]^1)
	err := s.Commit(ctx, []kv.Op{kv.CompareAndSwap([]byte("large/max"), other, nil)})
	expectConflict(t, err, 0, []byte("large/max"), true, maxV)
	err = s.Commit(ctx, []kv.Op{kv.PutIfAbsent(longB, nil)})
	expectConflict(t, err, 0, longB, true, mib[:1000])

	swap := []kv.Op{
		kv.CompareAndSwap([]byte("large/max"), maxV, mib),
		kv.CompareAndDelete([]byte("large/mib"), mib),
		kv.CompareAndSwap(longA, []byte("A"), maxV),
	}
	mustCommit(ctx, t, s, swap...)
	m.apply(swap...)
	o := kv.ScanOptions{}
	expectScan(ctx, t, s, o, m.scan(o))
}
