package pebble

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvtest"
	"github.com/engramkv/engram/engines/internal/enginetest"
)

func openDisk(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return s
}

// TestConformance runs the contract as written: pebble meets it in full.
func TestConformance(t *testing.T) {
	kvtest.RunConfig(t, kvtest.Config{}, func(t *testing.T) kv.Store { return openDisk(t, t.TempDir()) })
}

func TestReopen(t *testing.T) {
	enginetest.Reopen(t, t.TempDir(), func(dir string) (kv.Store, error) { return Open(Options{Dir: dir}) }, map[string][]byte{
		"big":      bytes.Repeat([]byte("v"), kv.MaxValueSize),
		"\xff\x00": []byte("high"),
	})
}

// TestGroupSemantics drives commitGroup directly (enginetest.GroupSemantics).
func TestGroupSemantics(t *testing.T) {
	s := openDisk(t, t.TempDir())
	defer s.Close()
	c := &committer{s: s, pending: map[string]written{}}
	enginetest.GroupSemantics(t, s, c.commitGroup, func() uint64 { return s.Stats().Groups })
}

// TestLargeBatch commits one batch as large as a DeleteRange of tens of
// thousands of keys writes in one revision, well over half a memtable: it
// must apply atomically (badger refuses such a batch; pebble turns it into
// a memtable of its own).
func TestLargeBatch(t *testing.T) {
	ctx := context.Background()
	s, err := Open(Options{Dir: t.TempDir(), MemTableSize: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	val := bytes.Repeat([]byte("x"), 200)
	var ops []kv.Op
	for i := range 40_000 { // about 10 MB
		ops = append(ops, kv.Put(fmt.Appendf(nil, "big/%06d", i), val))
	}
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 39_999} {
		if _, err := s.Get(ctx, fmt.Appendf(nil, "big/%06d", i)); err != nil {
			t.Errorf("key %d of the large batch: %v", i, err)
		}
	}
}

// TestConcurrentCommitsShareFsync checks that concurrent committers are
// grouped: far fewer pebble batches (fsyncs) than batches.
func TestConcurrentCommitsShareFsync(t *testing.T) {
	s := openDisk(t, t.TempDir())
	defer s.Close()
	enginetest.CommitsShareFsync(t, s, func() (uint64, uint64) { st := s.Stats(); return st.Batches, st.Groups })
}

func TestCommitContextCancelled(t *testing.T) {
	s := openDisk(t, t.TempDir())
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("v"))})
	if !errors.Is(err, context.Canceled) || errors.Is(err, kv.ErrUncertain) {
		t.Errorf("Commit with a cancelled context = %v, want a not-applied context error", err)
	}
	if _, err := s.Get(context.Background(), []byte("k")); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("cancelled batch landed: %v", err)
	}
}

func TestOpenOptions(t *testing.T) {
	if _, err := Open(Options{}); err == nil {
		t.Errorf("Open without Dir succeeded")
	}
	if _, err := Open(Options{Dir: t.TempDir(), CacheSize: -1}); err == nil {
		t.Errorf("Open with a negative cache size succeeded")
	}
}

func TestSizeReportsDiskUse(t *testing.T) {
	s := openDisk(t, t.TempDir())
	enginetest.WriteRevisions(t, s, 0, 1000)
	n, err := s.Size()
	if err != nil {
		t.Fatal(err)
	}
	if n < 512*1000 {
		t.Errorf("Size = %d after writing 1000 values of 512 bytes", n)
	}
	_ = s.Close()
	if _, err := s.Size(); !errors.Is(err, kv.ErrClosed) {
		t.Fatalf("Size after Close: %v", err)
	}
}

// TestScanSnapshotAndDeletes checks what a scan sees over the engine's versions and
// tombstones, and that it answers as of when it was opened
// (enginetest.ScanSnapshotAndDeletes).
func TestScanSnapshotAndDeletes(t *testing.T) {
	s := openDisk(t, t.TempDir())
	defer s.Close()
	enginetest.ScanSnapshotAndDeletes(t, s)
}

// TestCloseReleasesIterators: an iterator left open does not keep Close
// from closing the database, and fails afterwards with ErrClosed.
func TestCloseReleasesIterators(t *testing.T) {
	ctx := context.Background()
	s := openDisk(t, t.TempDir())
	enginetest.WriteRevisions(t, s, 0, 10)
	it, err := s.Scan(ctx, kv.ScanOptions{BatchSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := it.Next(ctx); err != nil || len(b) != 1 {
		t.Fatalf("first batch: %d pairs, %v", len(b), err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close with an open iterator: %v", err)
	}
	if _, err := it.Next(ctx); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Next after Close: %v, want ErrClosed", err)
	}
	if err := it.Close(); err != nil {
		t.Errorf("iterator Close after store Close: %v", err)
	}
}

// TestCompressionChangesOnReopen writes tables under each compression and
// reads all of them back under another: each table records its own, so an
// operator may change the setting on an existing data directory.
func TestCompressionChangesOnReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	val := bytes.Repeat([]byte("compressible "), 40)
	n := 0
	for _, c := range []string{"snappy", "none", "zstd", ""} {
		s, err := Open(Options{Dir: dir, Compression: c})
		if err != nil {
			t.Fatalf("Open(compression %q): %v", c, err)
		}
		for i := 0; i < n; i++ {
			got, err := s.Get(ctx, fmt.Appendf(nil, "k/%05d", i))
			if err != nil || !bytes.Equal(got, val) {
				t.Fatalf("compression %q: k/%05d = %q, %v; want the value written before", c, i, got, err)
			}
		}
		var ops []kv.Op
		for range 500 {
			ops = append(ops, kv.Put(fmt.Appendf(nil, "k/%05d", n), val))
			n++
		}
		if err := s.Commit(ctx, ops); err != nil {
			t.Fatal(err)
		}
		// Reclaim flushes the memtable into a table built with c.
		if err := s.Reclaim(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Open(Options{Dir: t.TempDir(), Compression: "lz4"}); err == nil || !strings.Contains(err.Error(), `unknown compression "lz4"`) {
		t.Errorf("Open with compression lz4: %v, want an error naming it", err)
	}
}
