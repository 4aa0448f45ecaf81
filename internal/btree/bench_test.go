package btree

import (
	"fmt"
	"testing"
)

// benchKey mimics an Engram internal key: a registry path plus framing.
func benchKey(i int) []byte {
	return fmt.Appendf(nil, "/registry/pods/namespace-%04d/pod-%08d\x00\x00\x00\x00\x00\x00\x00\x01", i%1000, i)
}

func benchTree(n int) *Tree {
	t := new(Tree)
	val := make([]byte, 512)
	for i := range n {
		t.Set(benchKey(i), val)
	}
	t.Freeze()
	return t
}

func BenchmarkGet(b *testing.B) {
	const n = 100_000
	v := benchTree(n).Freeze()
	keys := make([][]byte, 4096)
	for i := range keys {
		keys[i] = benchKey(i * 7919 % n)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, ok := v.Get(keys[i%len(keys)]); !ok {
			b.Fatal("key not found")
		}
	}
}

// BenchmarkSet replaces a key of a 100,000-key tree per operation, frozen
// after each (the native adaptor's commit: a path copy) or never frozen
// (the wasm plugin's commit with no scan open: in place).
func BenchmarkSet(b *testing.B) {
	const n = 100_000
	val := make([]byte, 512)
	keys := make([][]byte, 4096)
	for i := range keys {
		keys[i] = benchKey(i * 7919 % n)
	}
	for _, freeze := range []bool{true, false} {
		b.Run(fmt.Sprintf("freeze=%v", freeze), func(b *testing.B) {
			t := benchTree(n)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				t.Set(keys[i%len(keys)], val)
				if freeze {
					t.Freeze()
				}
			}
		})
	}
}

func BenchmarkWalk10k(b *testing.B) {
	v := benchTree(10_000).Freeze()
	for _, reverse := range []bool{false, true} {
		b.Run(fmt.Sprintf("reverse=%v", reverse), func(b *testing.B) {
			b.ReportAllocs()
			var c Cursor
			for b.Loop() {
				if reverse {
					c.SeekLT(v, nil)
				} else {
					c.SeekGE(v, nil)
				}
				n := 0
				for _, ok := c.Next(); ok; _, ok = c.Next() {
					n++
				}
				if n != 10_000 {
					b.Fatalf("walked %d items", n)
				}
			}
		})
	}
}
