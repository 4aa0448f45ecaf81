package badger

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/engramkv/engram/core/kv"
)

// bigPairs returns pairs filling several of the load's buffers, so that
// the feed writes some while the next fill.
func bigPairs(n int) []kv.Pair {
	ps := make([]kv.Pair, n)
	for i := range ps {
		ps[i] = kv.Pair{Key: fmt.Appendf(nil, "k/%06d", i), Value: bytes.Repeat([]byte{byte(i)}, 4<<10)}
	}
	return ps
}

// TestBulkLoadManyBuffers: every pair of a load spanning several buffers
// arrives, and a store closed in the middle of one is left with the marker
// alone.
func TestBulkLoadManyBuffers(t *testing.T) {
	ctx := context.Background()
	pairs := bigPairs(5 * loadBufferBytes / (4 << 10))

	s := openDisk(t, t.TempDir())
	defer s.Close()
	load, err := s.BulkLoad(ctx, testMarker)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(pairs); i += 100 {
		if err := load.Add(ctx, pairs[i:min(i+100, len(pairs))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := load.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	got := contents(t, s)
	if len(got) != len(pairs) {
		t.Fatalf("loaded store holds %d pairs, want %d", len(got), len(pairs))
	}
	for i := range got {
		if !bytes.Equal(got[i].Key, pairs[i].Key) || !bytes.Equal(got[i].Value, pairs[i].Value) {
			t.Fatalf("pair %d is %q (%d bytes), want %q", i, got[i].Key, len(got[i].Value), pairs[i].Key)
		}
	}

	dir := t.TempDir()
	s2 := openDisk(t, dir)
	load, err = s2.BulkLoad(ctx, testMarker)
	if err != nil {
		t.Fatal(err)
	}
	if err := load.Add(ctx, pairs[:len(pairs)/2]); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := load.Finish(ctx); err == nil {
		t.Fatal("Finish after Close succeeded")
	}
	s3 := openDisk(t, dir)
	defer s3.Close()
	wantOnlyMarker(t, s3)
}
