package pebble

import (
	"context"
	"fmt"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/plugins/internal/enginetest"
)

// openBench opens a store on disk, closed when the benchmark ends.
func openBench(b *testing.B) *Store {
	b.Helper()
	s := openDisk(b, b.TempDir())
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkCommit measures durable commits of 3-op batches through the
// adaptor: a PutIfAbsent, a Put of a pre-existing key and a Put, as
// plugins/badger's BenchmarkCommit. batches/fsync is the group-commit
// factor.
func BenchmarkCommit(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("committers=%d", n), func(b *testing.B) {
			s := openDisk(b, b.TempDir())
			defer s.Close()
			ctx := context.Background()
			val := make([]byte, enginetest.BenchValLen)
			for i := int64(0); i < 1024; i++ {
				if err := s.Commit(ctx, []kv.Op{kv.Put(enginetest.BenchKey("cas", i), val)}); err != nil {
					b.Fatal(err)
				}
			}
			before := s.Stats()
			enginetest.RunCommitters(b, n, func(seq int64) error {
				return s.Commit(ctx, []kv.Op{
					kv.PutIfAbsent(enginetest.BenchKey("new", seq), val),
					kv.Put(enginetest.BenchKey("cas", seq%1024), val),
					kv.Put(enginetest.BenchKey("side", seq), val[:64]),
				})
			})
			st := s.Stats()
			if g := st.Groups - before.Groups; g > 0 {
				b.ReportMetric(float64(st.Batches-before.Batches)/float64(g), "batches/fsync")
			}
		})
	}
}

func BenchmarkGet(b *testing.B) {
	s := openBench(b)
	ctx := context.Background()
	const n = 100_000
	val := make([]byte, enginetest.BenchValLen)
	enginetest.CommitEach(b, s, n, func(i int64) kv.Op { return kv.Put(enginetest.BenchKey("get", i), val) })
	keys := make([][]byte, 4096)
	for i := range keys {
		keys[i] = enginetest.BenchKey("get", int64(i)*7919%n)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := s.Get(ctx, keys[i%len(keys)]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkScanBeforeDeletedRun scans 10 live keys that sort just before
// 50,000 deleted ones, as a list of one resource next to a resource that was
// just deleted. The cost must stay that of 10 keys, not of the deleted run.
func BenchmarkScanBeforeDeletedRun(b *testing.B) {
	s := openBench(b)
	ctx := context.Background()
	val := make([]byte, enginetest.BenchValLen)
	const deleted = 50_000
	enginetest.CommitEach(b, s, deleted, func(i int64) kv.Op { return kv.Put(enginetest.BenchKey("pods", i), val) })
	enginetest.CommitEach(b, s, deleted, func(i int64) kv.Op { return kv.Delete(enginetest.BenchKey("pods", i)) })
	var ops []kv.Op
	for i := int64(0); i < 10; i++ {
		ops = append(ops, kv.Put(enginetest.BenchKey("nodes", i), val))
	}
	if err := s.Commit(ctx, ops); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		it, err := s.Scan(ctx, kv.ScanOptions{Start: []byte("/registry/nodes/"), End: []byte("/registry/nodes0")})
		if err != nil {
			b.Fatal(err)
		}
		batch, err := it.Next(ctx)
		if err != nil || len(batch) != 10 {
			b.Fatalf("scan = %d pairs, %v; want 10", len(batch), err)
		}
		it.Close()
	}
}
