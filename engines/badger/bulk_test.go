package badger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/engramkv/engram/core/kv"
)

var testMarker = kv.Pair{Key: []byte("m/import"), Value: []byte("unfinished")}

func loadPairs(n int) []kv.Pair {
	ps := make([]kv.Pair, n)
	for i := range ps {
		ps[i] = kv.Pair{Key: fmt.Appendf(nil, "k/%06d", i), Value: fmt.Appendf(nil, "v%d", i)}
	}
	return ps
}

// contents returns every pair of s.
func contents(t *testing.T, s kv.Store) []kv.Pair {
	t.Helper()
	var all []kv.Pair
	err := kv.ScanEach(context.Background(), s, kv.ScanOptions{}, func(p kv.Pair) error {
		all = append(all, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// wantPairs fails unless s holds exactly want.
func wantPairs(t *testing.T, s kv.Store, want []kv.Pair) {
	t.Helper()
	got := contents(t, s)
	if len(got) != len(want) {
		t.Fatalf("loaded store holds %d pairs, want %d", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i].Key, want[i].Key) || !bytes.Equal(got[i].Value, want[i].Value) {
			t.Fatalf("pair %d is %q (%d-byte value), want %q (%d bytes)", i, got[i].Key, len(got[i].Value), want[i].Key, len(want[i].Value))
		}
	}
}

func wantOnlyMarker(t *testing.T, s kv.Store) {
	t.Helper()
	got := contents(t, s)
	if len(got) != 1 || !bytes.Equal(got[0].Key, testMarker.Key) || !bytes.Equal(got[0].Value, testMarker.Value) {
		t.Fatalf("store holds %d pairs %q, want the marker alone", len(got), got)
	}
}

// startLoad opens a store in dir and starts a load of it; the test closes
// the store.
func startLoad(t *testing.T, dir string) (*Store, kv.Load) {
	t.Helper()
	s := openDisk(t, dir)
	load, err := s.BulkLoad(context.Background(), testMarker)
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	return s, load
}

func TestBulkLoad(t *testing.T) {
	ctx := context.Background()
	s, load := startLoad(t, t.TempDir())
	defer s.Close()
	// Nothing else may touch the store meanwhile.
	if _, err := s.Get(ctx, []byte("k/000001")); !errors.Is(err, kv.ErrLoading) {
		t.Fatalf("Get during a load: %v, want ErrLoading", err)
	}
	if _, err := s.Scan(ctx, kv.ScanOptions{}); !errors.Is(err, kv.ErrLoading) {
		t.Fatalf("Scan during a load: %v, want ErrLoading", err)
	}
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("x"), nil)}); !errors.Is(err, kv.ErrLoading) {
		t.Fatalf("Commit during a load: %v, want ErrLoading", err)
	}
	if _, err := s.BulkLoad(ctx, testMarker); !errors.Is(err, kv.ErrLoading) {
		t.Fatalf("a second BulkLoad: %v, want ErrLoading", err)
	}
	pairs := loadPairs(3000)
	if err := load.Add(ctx, pairs[:1000]); err != nil {
		t.Fatal(err)
	}
	if err := load.Add(ctx, pairs[:1]); err == nil {
		t.Fatal("Add accepted a key that sorts before the last one")
	}
	if err := load.Add(ctx, []kv.Pair{testMarker}); err == nil {
		t.Fatal("Add accepted the marker's key")
	}
	if err := load.Add(ctx, pairs[1000:]); err != nil {
		t.Fatal(err)
	}
	if err := load.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	wantPairs(t, s, pairs)
	// Later commits see and shadow the loaded versions.
	if err := s.Commit(ctx, []kv.Op{kv.CompareAndSwap(pairs[5].Key, pairs[5].Value, []byte("new")), kv.Delete(pairs[6].Key)}); err != nil {
		t.Fatalf("commit over loaded keys: %v", err)
	}
	if v, err := s.Get(ctx, pairs[5].Key); err != nil || string(v) != "new" {
		t.Fatalf("Get after the commit: %q, %v", v, err)
	}
	if _, err := s.Get(ctx, pairs[6].Key); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("Get of a deleted loaded key: %v", err)
	}
}

// TestBulkLoadStreams loads three key ranges as interleaved streams, each
// in its own StreamWriter stream, and refuses streams that overlap.
func TestBulkLoadStreams(t *testing.T) {
	ctx := context.Background()
	s := openDisk(t, t.TempDir())
	defer s.Close()
	load, err := s.BulkLoad(ctx, testMarker)
	if err != nil {
		t.Fatal(err)
	}
	var want []kv.Pair
	for _, prefix := range []string{"a", "e", "k"} {
		for i := range 2000 {
			want = append(want, kv.Pair{Key: fmt.Appendf(nil, "%s/%06d", prefix, i), Value: fmt.Appendf(nil, "%s%d", prefix, i)})
		}
	}
	// k's pairs first, then a's and e's taking turns, half each time.
	for _, step := range []struct{ stream, from, to int }{{2, 4000, 6000}, {0, 0, 1000}, {1, 2000, 3000}, {0, 1000, 2000}, {1, 3000, 4000}} {
		if err := load.AddTo(ctx, step.stream, want[step.from:step.to]); err != nil {
			t.Fatal(err)
		}
	}
	if err := load.AddTo(ctx, 2, want[4000:4001]); err == nil {
		t.Fatal("AddTo accepted a key that sorts before its stream's last")
	}
	if err := load.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	got := contents(t, s)
	if len(got) != len(want) {
		t.Fatalf("loaded store holds %d pairs, want %d", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i].Key, want[i].Key) || !bytes.Equal(got[i].Value, want[i].Value) {
			t.Fatalf("pair %d is %q=%q, want %q=%q", i, got[i].Key, got[i].Value, want[i].Key, want[i].Value)
		}
	}

	s2 := openDisk(t, t.TempDir())
	defer s2.Close()
	load, err = s2.BulkLoad(ctx, testMarker)
	if err != nil {
		t.Fatal(err)
	}
	defer load.Abort()
	if err := load.AddTo(ctx, 0, want[:10]); err != nil {
		t.Fatal(err)
	}
	if err := load.AddTo(ctx, 1, want[5:6]); err != nil {
		t.Fatal(err)
	}
	if err := load.Finish(ctx); err == nil {
		t.Fatal("Finish accepted streams whose key ranges overlap")
	}
}

func TestBulkLoadRefusesNonEmpty(t *testing.T) {
	ctx := context.Background()
	s := openDisk(t, t.TempDir())
	defer s.Close()
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("keep"), []byte("me"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BulkLoad(ctx, testMarker); !errors.Is(err, kv.ErrNotEmpty) {
		t.Fatalf("BulkLoad of a non-empty store: %v, want ErrNotEmpty", err)
	}
	if v, err := s.Get(ctx, []byte("keep")); err != nil || string(v) != "me" {
		t.Fatalf("the refused load touched the store: %q, %v", v, err)
	}
}

// TestBulkLoadInterrupted: a load that never finishes, closed or
// crashed, leaves the marker alone, and the next load replaces it.
func TestBulkLoadInterrupted(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openDisk(t, dir)
	load, err := s.BulkLoad(ctx, testMarker)
	if err != nil {
		t.Fatal(err)
	}
	if err := load.Add(ctx, loadPairs(100)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := load.Finish(ctx); err == nil {
		t.Fatal("Finish after Close succeeded")
	}
	s = openDisk(t, dir)
	wantOnlyMarker(t, s)

	// A crash after the tables were registered but before the marker
	// file went: load fully, then put the file back as the crash would
	// have left it.
	load, err = s.BulkLoad(ctx, testMarker)
	if err != nil {
		t.Fatalf("BulkLoad over an unfinished load: %v", err)
	}
	if err := load.Add(ctx, loadPairs(100)); err != nil {
		t.Fatal(err)
	}
	if err := load.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(contents(t, s)); n != 100 {
		t.Fatalf("loaded store holds %d pairs, want 100", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := writeLoadMarker(dir, testMarker); err != nil {
		t.Fatal(err)
	}
	s = openDisk(t, dir)
	defer s.Close()
	wantOnlyMarker(t, s)

	// Abort marks the store at once, without a restart.
	load, err = s.BulkLoad(ctx, testMarker)
	if err != nil {
		t.Fatal(err)
	}
	if err := load.Add(ctx, loadPairs(10)); err != nil {
		t.Fatal(err)
	}
	if err := load.Abort(); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, testMarker.Key); err != nil || !bytes.Equal(v, testMarker.Value) {
		t.Fatalf("marker after Abort: %q, %v", v, err)
	}
}

// bigPairs are n pairs of 64 KiB values: 64 of them fill a Write buffer,
// so a load of several hundred keeps the writer goroutine busy while the
// caller fills the next buffer.
func bigPairs(n int) []kv.Pair {
	ps := make([]kv.Pair, n)
	for i := range ps {
		v := bytes.Repeat([]byte{byte(i)}, 64<<10)
		ps[i] = kv.Pair{Key: fmt.Appendf(nil, "k/%06d", i), Value: v}
	}
	return ps
}

// TestBulkLoadManyBuffers loads more than the writer's two buffers hold,
// so buffers are written while others fill, and checks every pair.
func TestBulkLoadManyBuffers(t *testing.T) {
	ctx := context.Background()
	s, load := startLoad(t, t.TempDir())
	defer s.Close()
	defer load.Abort()
	want := bigPairs(400)
	for i := 0; i < len(want); i += 7 {
		if err := load.Add(ctx, want[i:min(i+7, len(want))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := load.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	wantPairs(t, s, want)
}

// TestBulkLoadCloseWhileWriting closes the store while buffers are still
// being written: the Write under way ends before the StreamWriter is
// cancelled, and the store reopens holding the marker alone.
func TestBulkLoadCloseWhileWriting(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, load := startLoad(t, dir)
	// Three buffers' worth: two handed to the writer, the third filling.
	if err := load.Add(ctx, bigPairs(64*3-1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := load.Add(ctx, bigPairs(1)); err == nil {
		t.Fatal("Add after Close succeeded")
	}
	if err := load.Finish(ctx); err == nil {
		t.Fatal("Finish after Close succeeded")
	}
	if err := load.Abort(); err != nil {
		t.Fatal(err)
	}
	s = openDisk(t, dir)
	defer s.Close()
	wantOnlyMarker(t, s)
}
