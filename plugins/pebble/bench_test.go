package pebble

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/engramkv/engram/core/kv"
)

// Benchmark batches mimic one etcd write, as plugins/badger's do: three ops
// with ~70-byte keys and 512-byte values.
const (
	benchKeyLen = 70
	benchValLen = 512
)

func benchKey(prefix string, i int64) []byte {
	k := fmt.Appendf(nil, "/registry/%s/namespace-%04d/object-%016d", prefix, i%1000, i)
	for len(k) < benchKeyLen {
		k = append(k, '.')
	}
	return k
}

// openBench opens a store on disk, closed when the benchmark ends.
func openBench(b *testing.B) *Store {
	b.Helper()
	s := openDisk(b, b.TempDir())
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// commitEach commits op(0) .. op(n-1) in batches of 1000.
func commitEach(b *testing.B, s *Store, n int64, op func(i int64) kv.Op) {
	b.Helper()
	ops := make([]kv.Op, 0, 1000)
	for i := int64(0); i < n; i++ {
		ops = append(ops, op(i))
		if len(ops) == cap(ops) || i == n-1 {
			if err := s.Commit(context.Background(), ops); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
}

// runCommitters runs b.N operations on exactly n goroutines and reports
// throughput; op receives a unique sequence number.
func runCommitters(b *testing.B, n int, op func(seq int64) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "commits/s")
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
			val := make([]byte, benchValLen)
			for i := int64(0); i < 1024; i++ {
				if err := s.Commit(ctx, []kv.Op{kv.Put(benchKey("cas", i), val)}); err != nil {
					b.Fatal(err)
				}
			}
			before := s.Stats()
			runCommitters(b, n, func(seq int64) error {
				return s.Commit(ctx, []kv.Op{
					kv.PutIfAbsent(benchKey("new", seq), val),
					kv.Put(benchKey("cas", seq%1024), val),
					kv.Put(benchKey("side", seq), val[:64]),
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
	val := make([]byte, benchValLen)
	commitEach(b, s, n, func(i int64) kv.Op { return kv.Put(benchKey("get", i), val) })
	keys := make([][]byte, 4096)
	for i := range keys {
		keys[i] = benchKey("get", int64(i)*7919%n)
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
	val := make([]byte, benchValLen)
	const deleted = 50_000
	commitEach(b, s, deleted, func(i int64) kv.Op { return kv.Put(benchKey("pods", i), val) })
	commitEach(b, s, deleted, func(i int64) kv.Op { return kv.Delete(benchKey("pods", i)) })
	var ops []kv.Op
	for i := int64(0); i < 10; i++ {
		ops = append(ops, kv.Put(benchKey("nodes", i), val))
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
