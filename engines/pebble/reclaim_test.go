package pebble

import (
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/enginetest"
)

// TestReclaimShrinksDisk deletes most of what was written, as a compaction
// of history does, and checks that Reclaim gives the tables' space back
// while the live keys stay readable.
func TestReclaimShrinksDisk(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openDisk(t, dir)
	defer s.Close()
	const total, live = 60_000, 2_000
	enginetest.WriteRevisions(t, s, 0, total)
	enginetest.DeleteRevisions(t, s, live, total)
	if err := s.Reclaim(ctx); err != nil {
		t.Fatal(err)
	}
	// The tables are what Reclaim shrinks: 30 times the live data was
	// written. (The directory also holds the WAL files pebble preallocates
	// and recycles, which do not depend on what was deleted.)
	after := s.tablesSize()
	liveBytes := enginetest.RevBytes(live)
	t.Logf("tables after reclaiming %d bytes; live data %d bytes; directory %d bytes", after, liveBytes, enginetest.DiskUse(t, dir))
	if after == 0 || after > 2*liveBytes {
		t.Errorf("tables after reclaiming take %d bytes (live data %d)", after, liveBytes)
	}
	enginetest.CheckRevisions(t, s, live, total)
	it, err := s.Scan(ctx, kv.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for {
		batch, err := it.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(batch) == 0 {
			break
		}
		n += len(batch)
	}
	if n != live {
		t.Errorf("scan after reclaiming: %d keys, want %d", n, live)
	}
}

// TestReclaimWhileCommitting runs a reclamation while commits arrive: no
// commit fails.
func TestReclaimWhileCommitting(t *testing.T) {
	enginetest.ReclaimWhileCommitting(t, openDisk(t, t.TempDir()))
}

// TestReclaimHonoursContext: a Reclaim whose context is already done does
// no work and says why, as kv.Reclaimer requires.
func TestReclaimHonoursContext(t *testing.T) {
	s := openDisk(t, t.TempDir())
	defer s.Close()
	enginetest.WriteRevisions(t, s, 0, 100)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Reclaim(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reclaim with a canceled context: %v, want context.Canceled", err)
	}
	if n := s.tablesSize(); n != 0 {
		t.Fatalf("a canceled Reclaim flushed the memtable: %d bytes of tables", n)
	}
	if err := s.Reclaim(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := s.tablesSize(); n == 0 {
		t.Fatal("Reclaim left the writes in the memtable")
	}
}

// tablesSize is the bytes of the live tables, which Reclaim shrinks (the
// directory also holds the WAL, which pebble recycles).
func (s *Store) tablesSize() int64 {
	return s.db.Metrics().Total().TablesSize
}
