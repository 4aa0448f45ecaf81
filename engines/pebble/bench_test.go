package pebble

import (
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/enginetest"
)

// openBench opens a store on disk, closed when the benchmark ends.
func openBench(b *testing.B) *Store {
	b.Helper()
	s := openDisk(b, b.TempDir())
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkCommit measures durable commits of 3-op batches through the
// adaptor (enginetest.BenchCommit); batches/fsync is the group-commit factor.
func BenchmarkCommit(b *testing.B) {
	enginetest.BenchCommit(b, func(b *testing.B) kv.Store { return openBench(b) },
		func(s kv.Store) (uint64, uint64) { st := s.(*Store).Stats(); return st.Batches, st.Groups })
}

func BenchmarkGet(b *testing.B) { enginetest.BenchGet(b, openBench(b)) }

// BenchmarkScanBeforeDeletedRun: scanning 10 live keys next to 50,000
// deleted ones must cost 10 keys (enginetest.BenchScanBeforeDeletedRun).
func BenchmarkScanBeforeDeletedRun(b *testing.B) {
	enginetest.BenchScanBeforeDeletedRun(b, openBench(b))
}
