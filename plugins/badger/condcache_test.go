package badger

import (
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/kv"
)

func TestCondCache(t *testing.T) {
	c := newCondCache(4)
	k := []byte("k")
	cas := func(expected string) kv.Op { return kv.CompareAndSwap(k, []byte(expected), []byte("next")) }
	if c.holds(cas("v1")) || c.holds(kv.PutIfAbsent(k, nil)) {
		t.Fatal("an unknown key proved a condition")
	}
	c.wrote([]kv.Op{kv.PutIfAbsent(k, []byte("v1"))})
	if !c.holds(cas("v1")) {
		t.Fatal("pending write not seen by a later batch of the transaction")
	}
	c.settle(true)
	if !c.holds(cas("v1")) || c.holds(cas("v2")) || c.holds(kv.PutIfAbsent(k, nil)) {
		t.Fatal("committed value: wrong answers")
	}
	c.wrote([]kv.Op{kv.Delete(k)})
	c.settle(true)
	if !c.holds(kv.PutIfAbsent(k, nil)) || c.holds(cas("v1")) || c.holds(kv.CompareAndDelete(k, []byte("v1"))) {
		t.Fatal("deleted key: wrong answers")
	}
	c.wrote([]kv.Op{kv.Put(k, []byte("v3"))})
	c.settle(false) // failed or uncertain: badger may hold v3 or not
	if c.holds(kv.PutIfAbsent(k, nil)) || c.holds(cas("v3")) {
		t.Fatal("key of a failed transaction still proves conditions")
	}
	c.wrote([]kv.Op{kv.PutIfAbsent(k, []byte("v4"))})
	c.discard()
	c.settle(true)
	if c.holds(cas("v4")) {
		t.Fatal("discarded write became known")
	}
	for _, key := range []string{"a", "b", "c", "d", "e"} {
		c.wrote([]kv.Op{kv.PutIfAbsent([]byte(key), []byte("v"))})
		c.settle(true)
	}
	if c.lru.Len() != 4 {
		t.Fatalf("cache holds %d entries, bound 4", c.lru.Len())
	}
}

// TestConditionsAfterCachedWrites runs conditions through the store with the
// cache on: what it proves must match what badger holds, and a conflict
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

func TestCondCacheFollowsPlainWrites(t *testing.T) {
	c := newCondCache(8)
	k := []byte("k")
	c.wrote([]kv.Op{kv.Put([]byte("history"), []byte("x"))})
	c.settle(true)
	if c.lru.Contains("history") {
		t.Fatal("a key written without a condition and unknown before was cached")
	}
	c.wrote([]kv.Op{kv.PutIfAbsent(k, []byte("v1"))})
	c.settle(true)
	c.wrote([]kv.Op{kv.Put(k, []byte("v2"))}) // a plain write to a known key
	c.settle(true)
	if c.holds(kv.CompareAndSwap(k, []byte("v1"), nil)) || !c.holds(kv.CompareAndSwap(k, []byte("v2"), nil)) {
		t.Fatal("a plain write to a known key left its entry stale")
	}
	c.wrote([]kv.Op{kv.Delete(k)})
	c.settle(true)
	if c.holds(kv.CompareAndSwap(k, []byte("v2"), nil)) || !c.holds(kv.PutIfAbsent(k, nil)) {
		t.Fatal("a plain delete of a known key left its entry stale")
	}
}
