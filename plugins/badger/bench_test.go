package badger

import (
	"context"
	"fmt"
	"testing"

	badgerdb "github.com/dgraph-io/badger/v3"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/plugins/internal/enginetest"
)

// openBench opens a store on disk, closed when the benchmark ends.
func openBench(b *testing.B) *Store {
	b.Helper()
	s, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkCommit measures durable commits of 3-op batches through the
// adaptor: a PutIfAbsent, a CompareAndSwap of a pre-existing key and a Put.
// batches/fsync is the group-commit factor.
func BenchmarkCommit(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("committers=%d", n), func(b *testing.B) {
			s, err := Open(Options{Dir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			val := make([]byte, enginetest.BenchValLen)
			// One CAS target per committer slot keeps the CAS uncontended;
			// contention is ConcurrentCASCounter's business, not this one's.
			for i := int64(0); i < 1024; i++ {
				if err := s.Commit(ctx, []kv.Op{kv.Put(enginetest.BenchKey("cas", i), val)}); err != nil {
					b.Fatal(err)
				}
			}
			before := s.Stats()
			enginetest.RunCommitters(b, n, func(seq int64) error {
				return s.Commit(ctx, []kv.Op{
					kv.PutIfAbsent(enginetest.BenchKey("new", seq), val),
					// Only sequence numbers congruent modulo 1024 share a
					// key, and they are 1024 commits apart.
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

// BenchmarkBaseline commits the same batches with one badger transaction
// each (SyncWrites on), the obvious way to use badger. Badger merges
// concurrent transactions into one write request, but syncs its WAL once
// per transaction inside it, so its throughput barely grows with
// committers; this is why the adaptor has its own committer.
func BenchmarkBaseline(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("committers=%d", n), func(b *testing.B) {
			db, err := badgerdb.Open(badgerdb.DefaultOptions(b.TempDir()).
				WithSyncWrites(true).WithLogger(nil).WithMetricsEnabled(false))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			val := make([]byte, enginetest.BenchValLen)
			enginetest.RunCommitters(b, n, func(seq int64) error {
				return db.Update(func(txn *badgerdb.Txn) error {
					for _, k := range [][]byte{enginetest.BenchKey("new", seq), enginetest.BenchKey("cas", seq%1024), enginetest.BenchKey("side", seq)} {
						if err := txn.Set(k, val); err != nil {
							return err
						}
					}
					return nil
				})
			})
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
// just deleted, or compaction reading one key's history next to compacted
// history. The cost must stay that of 10 keys, not of the deleted run.
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
