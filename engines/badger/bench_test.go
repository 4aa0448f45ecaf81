package badger

import (
	"fmt"
	"testing"

	badgerdb "github.com/dgraph-io/badger/v3"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/enginetest"
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
// adaptor (enginetest.BenchCommit); batches/fsync is the group-commit factor.
func BenchmarkCommit(b *testing.B) {
	enginetest.BenchCommit(b, func(b *testing.B) kv.Store { return openBench(b) },
		func(s kv.Store) (uint64, uint64) { st := s.(*Store).Stats(); return st.Batches, st.Groups })
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

func BenchmarkGet(b *testing.B) { enginetest.BenchGet(b, openBench(b)) }

// BenchmarkScanBeforeDeletedRun: scanning 10 live keys next to 50,000
// deleted ones must cost 10 keys (enginetest.BenchScanBeforeDeletedRun).
func BenchmarkScanBeforeDeletedRun(b *testing.B) {
	enginetest.BenchScanBeforeDeletedRun(b, openBench(b))
}
