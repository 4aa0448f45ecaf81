package memkv

import (
	"context"
	"fmt"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/enginetest"
)

// benchKey mimics an Engram internal key: a registry path plus framing.
func benchKey(i int) []byte {
	return fmt.Appendf(nil, "/registry/pods/namespace-%04d/pod-%08d\x00\x00\x00\x00\x00\x00\x00\x01", i%1000, i)
}

func filled(b testing.TB, n int) *Store {
	b.Helper()
	s := New()
	val := make([]byte, 512)
	enginetest.CommitEach(b, s, int64(n), func(i int64) kv.Op { return kv.Put(benchKey(int(i)), val) })
	return s
}

// BenchmarkGet is the embedded engines' parallel read benchmark
// (enginetest.BenchGet), on memkv.
func BenchmarkGet(b *testing.B) { enginetest.BenchGet(b, New()) }

// BenchmarkCommit3 commits batches shaped like an etcd write: a
// PutIfAbsent of the new revision key, a CompareAndSwap of the key index,
// and a Put of a small side record.
func BenchmarkCommit3(b *testing.B) {
	const n = 100_000
	s := filled(b, n)
	ctx := context.Background()
	val := make([]byte, 512)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := benchKey(i % n)
		ops := []kv.Op{
			kv.PutIfAbsent(fmt.Appendf(nil, "rev/%016x", i), val),
			kv.CompareAndSwap(k, val, val),
			kv.Put(fmt.Appendf(nil, "meta/%08d", i%1000), val[:16]),
		}
		if err := s.Commit(ctx, ops); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkScan10k(b *testing.B) {
	s := filled(b, 10_000)
	ctx := context.Background()
	b.ResetTimer()
	for _, reverse := range []bool{false, true} {
		b.Run(fmt.Sprintf("reverse=%v", reverse), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				it, err := s.Scan(ctx, kv.ScanOptions{Reverse: reverse})
				if err != nil {
					b.Fatal(err)
				}
				total := 0
				for {
					batch, err := it.Next(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if len(batch) == 0 {
						break
					}
					total += len(batch)
				}
				it.Close()
				if total != 10_000 {
					b.Fatalf("scanned %d pairs", total)
				}
			}
		})
	}
}
