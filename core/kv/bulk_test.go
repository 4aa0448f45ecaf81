package kv_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/memkv"
)

// TestCommitLoader covers the fallback every store without its own
// BulkLoader gets: refused on a store with data, the marker first, a
// stopped load replaced by the next, the marker gone after Finish.
func TestCommitLoader(t *testing.T) {
	ctx := context.Background()
	marker := kv.Pair{Key: []byte("m"), Value: []byte("loading")}
	s := memkv.New()
	defer s.Close()
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("data"), []byte("x"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.BulkLoaderOf(s, 0).BulkLoad(ctx, marker); !errors.Is(err, kv.ErrNotEmpty) {
		t.Fatalf("load into a store with data: %v, want ErrNotEmpty", err)
	}

	s2 := memkv.New()
	defer s2.Close()
	loader := kv.BulkLoaderOf(s2, 16) // a Commit per pair or so
	load, err := loader.BulkLoad(ctx, marker)
	if err != nil {
		t.Fatal(err)
	}
	if err := load.Add(ctx, []kv.Pair{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: []byte("2")}}); err != nil {
		t.Fatal(err)
	}
	if err := load.Add(ctx, []kv.Pair{{Key: []byte("a")}}); err == nil {
		t.Fatal("Add accepted a key out of order")
	}
	if v, err := s2.Get(ctx, marker.Key); err != nil || !bytes.Equal(v, marker.Value) {
		t.Fatalf("marker during the load: %q, %v", v, err)
	}
	// Stopped: the next load discards what the first wrote.
	if err := load.Abort(); err != nil {
		t.Fatal(err)
	}
	load, err = loader.BulkLoad(ctx, marker)
	if err != nil {
		t.Fatalf("load over a stopped one: %v", err)
	}
	if _, err := s2.Get(ctx, []byte("a")); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("the stopped load's pair survived: %v", err)
	}
	if err := load.Add(ctx, []kv.Pair{{Key: []byte("c"), Value: []byte("3")}}); err != nil {
		t.Fatal(err)
	}
	if err := load.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Get(ctx, marker.Key); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("marker after Finish: %v", err)
	}
	if v, err := s2.Get(ctx, []byte("c")); err != nil || string(v) != "3" {
		t.Fatalf("loaded pair: %q, %v", v, err)
	}
}
