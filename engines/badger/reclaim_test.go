package badger

import (
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/enginetest"
)

// TestReclaimShrinksDisk deletes most of what was written, as a compaction
// of history does, and checks that Reclaim gives the space back while the
// live keys stay readable.
func TestReclaimShrinksDisk(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	// No background loop: the test calls Reclaim itself.
	s, err := Open(Options{Dir: dir, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const total, live = 60_000, 2_000
	enginetest.WriteRevisions(t, s, 0, total)
	enginetest.DeleteRevisions(t, s, live, total)
	if !s.reclaimDue(s.reclaim.deletes.Load()) {
		t.Errorf("%d deletes of %d keys do not make a reclamation due", total-live, total)
	}
	before := enginetest.DiskUse(t, dir)
	if err := s.Reclaim(ctx); err != nil {
		t.Fatal(err)
	}
	after := enginetest.DiskUse(t, dir)
	liveBytes := enginetest.RevBytes(live)
	t.Logf("disk before %d, after %d bytes; live data %d bytes", before, after, liveBytes)
	if after > before/4 || after > 3*liveBytes {
		t.Errorf("disk after reclaiming is %d bytes (before %d, live data %d)", after, before, liveBytes)
	}
	if s.reclaimDue(s.reclaim.deletes.Load()) {
		t.Error("a reclamation is still due right after one")
	}
	enginetest.CheckRevisions(t, s, live, total)
	// The flush marker lives outside the data namespace and is gone.
	it, err := s.Scan(ctx, kv.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
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
	it.Close()
	if n != live {
		t.Errorf("scan after reclaiming: %d keys, want %d", n, live)
	}
}

// TestReclaimWhileCommitting runs a reclamation while commits arrive: the
// memtable flush happens between two commit groups, so no commit fails.
func TestReclaimWhileCommitting(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	enginetest.ReclaimWhileCommitting(t, s)
}

// TestReclaimLoopStopsOnClose opens a store with the loop running and
// closes it: Close must return (the loop exits) and be repeatable.
func TestReclaimLoopStopsOnClose(t *testing.T) {
	s := openDisk(t, t.TempDir())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.reclaim.done:
	default:
		t.Error("reclaim loop still running after Close")
	}
	if err := s.Close(); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

// TestFlushedThrough checks what the reclamation of a busy store waits for:
// writes still in the memtable are not in a table until a flush.
func TestFlushedThrough(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	enginetest.WriteRevisions(t, s, 0, 100)
	ts := s.lastCommitTs()
	if s.flushedThrough(ts) {
		t.Fatal("writes in the memtable reported as flushed")
	}
	if err := s.Reclaim(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !s.flushedThrough(ts) {
		t.Error("writes not reported as flushed after a forced flush")
	}
}

// TestReclaimChecks drives the loop's decision check by check: a burst of
// deletes is waited out, a long one is reclaimed in its middle, and the
// rest of that burst gets a pass of its own once it stops, even when the
// size rule alone would not grant it.
func TestReclaimChecks(t *testing.T) {
	var c reclaimChecks
	sizeRule := false
	due := func(int64) bool { return sizeRule }
	var deletes, pending int64
	var batches uint64
	step := func(newDeletes int64) (run bool) {
		deletes += newDeletes
		batches++
		run, busy := c.check(deletes, batches, pending, due)
		if !busy {
			t.Fatalf("a check after a batch saw no writes")
		}
		if run {
			pending = deletes // what reclaimWith records when it starts
			c.reclaimed()
		}
		return run
	}

	// Nothing due: no reclamation, burst or not.
	if step(0) || step(5) {
		t.Fatal("reclaimed with nothing due")
	}
	// Due, but deletes still arriving: waited out for reclaimMaxBurst
	// checks, then reclaimed in the middle of the burst.
	sizeRule = true
	c.bursting = 0
	for i := 1; i < reclaimMaxBurst; i++ {
		if step(reclaimMinDeletes) {
			t.Fatalf("reclaimed at check %d of a burst, want to wait %d", i, reclaimMaxBurst)
		}
	}
	if !step(reclaimMinDeletes) {
		t.Fatal("a burst longer than reclaimMaxBurst checks was not reclaimed")
	}
	// The burst goes on, then stops; its later deletes are a small share
	// of the tree (the size rule says no), but they get their pass.
	sizeRule = false
	step(reclaimMinDeletes / 2)
	step(reclaimMinDeletes / 2)
	if !step(0) {
		t.Fatal("the rest of a burst reclaimed mid-way got no pass once it stopped")
	}
	// That pass ran with the burst over: nothing more is owed.
	step(reclaimMinDeletes)
	if step(0) || step(0) {
		t.Fatal("a pass after the end of a burst was followed by another on the count alone")
	}
	// Fewer than reclaimMinDeletes after a mid-burst pass: not worth one.
	sizeRule = true
	c.bursting = reclaimMaxBurst
	if !step(reclaimMinDeletes) {
		t.Fatal("a due pass in a long burst did not run")
	}
	sizeRule = false
	step(reclaimMinDeletes - 1)
	if step(0) {
		t.Fatal("a burst's rest below reclaimMinDeletes got a pass")
	}
}
