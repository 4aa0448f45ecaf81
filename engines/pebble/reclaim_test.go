package pebble

import (
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/diskuse"
	"github.com/engramkv/engram/engines/internal/enginetest"
)

func diskUse(t *testing.T, dir string) int64 {
	t.Helper()
	n, err := diskuse.Allocated(dir)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

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
	for i := live; i < total; i += 5000 {
		var ops []kv.Op
		for j := i; j < min(i+5000, total); j++ {
			ops = append(ops, kv.Delete(enginetest.RevKey(j)))
		}
		if err := s.Commit(ctx, ops); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Reclaim(ctx); err != nil {
		t.Fatal(err)
	}
	// The tables are what Reclaim shrinks: 30 times the live data was
	// written. (The directory also holds the WAL files pebble preallocates
	// and recycles, which do not depend on what was deleted.)
	after := s.tablesSize()
	liveBytes := int64(live * (len(enginetest.RevKey(0)) + 512))
	t.Logf("tables after reclaiming %d bytes; live data %d bytes; directory %d bytes", after, liveBytes, diskUse(t, dir))
	if after == 0 || after > 2*liveBytes {
		t.Errorf("tables after reclaiming take %d bytes (live data %d)", after, liveBytes)
	}
	for _, i := range []int{0, live - 1} {
		if _, err := s.Get(ctx, enginetest.RevKey(i)); err != nil {
			t.Errorf("live key %d: %v", i, err)
		}
	}
	for _, i := range []int{live, total - 1} {
		if _, err := s.Get(ctx, enginetest.RevKey(i)); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("deleted key %d: got %v, want ErrNotFound", i, err)
		}
	}
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
