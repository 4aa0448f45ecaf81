package badger

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
	"github.com/engramkv/engram/engines/internal/groupcommit"
)

// suiteConfig is the contract as written: badger meets it in full.
var suiteConfig = kvtest.Config{}

func openDisk(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return s
}

func TestConformance(t *testing.T) {
	kvtest.RunConfig(t, suiteConfig, func(t *testing.T) kv.Store { return openDisk(t, t.TempDir()) })
}

func TestConformanceInMemory(t *testing.T) {
	cfg := suiteConfig
	cfg.MaxValueSize = MaxInMemoryValueSize
	kvtest.RunConfig(t, cfg, func(t *testing.T) kv.Store {
		s, err := Open(Options{InMemory: true})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	})
}

func TestReopen(t *testing.T) {
	enginetest.Reopen(t, t.TempDir(), func(dir string) (kv.Store, error) { return Open(Options{Dir: dir}) }, map[string][]byte{
		"big":          bytes.Repeat([]byte("v"), 2<<20), // lands in the value log
		"!badger!head": []byte("mine"),
	})
}

// TestGroupSemantics drives commitGroup directly (enginetest.GroupSemantics).
func TestGroupSemantics(t *testing.T) {
	s := openDisk(t, t.TempDir())
	defer s.Close()
	enginetest.GroupSemantics(t, s, s.commitGroup, func() uint64 { return s.Stats().Groups })
}

// TestGroupSplitsAtTxnLimit commits, as one group, more data than one
// badger transaction may hold; the committer must cut it into several
// transactions and apply everything.
func TestGroupSplitsAtTxnLimit(t *testing.T) {
	ctx := context.Background()
	s, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	val := bytes.Repeat([]byte("x"), 512<<10) // below the value threshold: counts fully
	n := int(2*s.maxTxnSize/int64(len(val))) + 2
	reqs := make([]*groupcommit.Request, n)
	for i := range reqs {
		ops := []kv.Op{kv.Put(fmt.Appendf(nil, "big/%03d", i), val)}
		reqs[i] = groupcommit.NewRequest(ops)
		reqs[i].Size, reqs[i].Count = s.entrySize(ops[0]), 1
	}
	before := s.Stats().Groups
	s.commitGroup(reqs)
	for i, r := range reqs {
		if err := <-r.Done(); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
	}
	if g := s.Stats().Groups - before; g < 3 {
		t.Errorf("%d batches of %d bytes went into %d transactions; limit is %d bytes", n, len(val), g, s.maxTxnSize)
	}
	if _, err := s.Get(ctx, fmt.Appendf(nil, "big/%03d", n-1)); err != nil {
		t.Errorf("last batch: %v", err)
	}
	// A single batch over the limit is refused up front, not half written.
	var ops []kv.Op
	for i := 0; int64(i*len(val)) <= s.maxTxnSize; i++ {
		ops = append(ops, kv.Put(fmt.Appendf(nil, "huge/%03d", i), val))
	}
	if err := s.Commit(ctx, ops); err == nil || errors.Is(err, kv.ErrUncertain) {
		t.Errorf("Commit of a batch over the engine limit = %v, want a plain error", err)
	}
	if _, err := s.Get(ctx, []byte("huge/000")); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("part of a refused batch landed: %v", err)
	}
}

// TestConcurrentCommitsShareFsync checks that concurrent committers are
// grouped: far fewer transactions (fsyncs) than batches.
func TestConcurrentCommitsShareFsync(t *testing.T) {
	s := openDisk(t, t.TempDir())
	defer s.Close()
	enginetest.CommitsShareFsync(t, s, func() (uint64, uint64) { st := s.Stats(); return st.Batches, st.Groups })
}

func TestCommitContextCancelled(t *testing.T) {
	s, err := Open(Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("v"))})
	if !errors.Is(err, context.Canceled) || errors.Is(err, kv.ErrUncertain) {
		t.Errorf("Commit with a cancelled context = %v, want a not-applied context error", err)
	}
	if _, err := s.Get(context.Background(), []byte("k")); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("cancelled batch landed: %v", err)
	}
}

func TestOpenOptions(t *testing.T) {
	if _, err := Open(Options{}); err == nil {
		t.Errorf("Open without Dir or InMemory succeeded")
	}
	if _, err := Open(Options{InMemory: true, Dir: t.TempDir()}); err == nil {
		t.Errorf("Open with both Dir and InMemory succeeded")
	}
}

func TestSizeReportsDiskUse(t *testing.T) {
	s := openDisk(t, t.TempDir())
	defer s.Close()
	if _, err := s.Size(); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if _, err := s.Size(); !errors.Is(err, kv.ErrClosed) {
		t.Fatalf("Size after Close: %v", err)
	}
}

// TestScanVersionsAndDeletes checks what a scan sees over the engine's versions and
// tombstones, and that it answers as of when it was opened
// (enginetest.ScanSnapshotAndDeletes).
func TestScanVersionsAndDeletes(t *testing.T) {
	s := openDisk(t, t.TempDir())
	defer s.Close()
	enginetest.ScanSnapshotAndDeletes(t, s)
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
		// Close flushes the memtable into a table built with c.
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Open(Options{Dir: t.TempDir(), Compression: "lz4"}); err == nil || !strings.Contains(err.Error(), `unknown compression "lz4"`) {
		t.Errorf("Open with compression lz4: %v, want an error naming it", err)
	}
}
