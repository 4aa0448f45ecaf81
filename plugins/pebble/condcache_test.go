package pebble

import (
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/kv"
)

// TestConditionsAfterCachedWrites runs conditions through the store with the
// cache on: what it proves must match what pebble holds, and a conflict
// still reports the engine's current value.
func TestConditionsAfterCachedWrites(t *testing.T) {
	ctx := context.Background()
	s := openDisk(t, t.TempDir())
	defer s.Close()
	k := []byte("k")
	if err := s.Commit(ctx, []kv.Op{kv.PutIfAbsent(k, []byte("v1"))}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, []kv.Op{kv.CompareAndSwap(k, []byte("v1"), []byte("v2"))}); err != nil {
		t.Fatal(err)
	}
	err := s.Commit(ctx, []kv.Op{kv.CompareAndSwap(k, []byte("v1"), []byte("v3"))})
	c, ok := kv.AsConflict(err)
	if !ok || !c.Exists || string(c.Current) != "v2" {
		t.Fatalf("stale CAS: %v (conflict %+v)", err, c)
	}
	if err := s.Commit(ctx, []kv.Op{kv.CompareAndDelete(k, []byte("v2"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, k); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := s.Commit(ctx, []kv.Op{kv.PutIfAbsent(k, []byte("again"))}); err != nil {
		t.Fatal(err)
	}
	err = s.Commit(ctx, []kv.Op{kv.PutIfAbsent(k, []byte("twice"))})
	if c, ok := kv.AsConflict(err); !ok || string(c.Current) != "again" {
		t.Fatalf("put-if-absent on a present key: %v", err)
	}
}
