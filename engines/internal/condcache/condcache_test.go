package condcache

import (
	"testing"

	"github.com/engramkv/engram/core/kv"
)

func TestCondCache(t *testing.T) {
	c := New(4)
	k := []byte("k")
	cas := func(expected string) kv.Op { return kv.CompareAndSwap(k, []byte(expected), []byte("next")) }
	if c.Holds(cas("v1")) || c.Holds(kv.PutIfAbsent(k, nil)) {
		t.Fatal("an unknown key proved a condition")
	}
	c.Wrote([]kv.Op{kv.PutIfAbsent(k, []byte("v1"))})
	if !c.Holds(cas("v1")) {
		t.Fatal("pending write not seen by a later batch of the transaction")
	}
	c.Settle(true)
	if !c.Holds(cas("v1")) || c.Holds(cas("v2")) || c.Holds(kv.PutIfAbsent(k, nil)) {
		t.Fatal("committed value: wrong answers")
	}
	c.Wrote([]kv.Op{kv.Delete(k)})
	c.Settle(true)
	if !c.Holds(kv.PutIfAbsent(k, nil)) || c.Holds(cas("v1")) || c.Holds(kv.CompareAndDelete(k, []byte("v1"))) {
		t.Fatal("deleted key: wrong answers")
	}
	c.Wrote([]kv.Op{kv.Put(k, []byte("v3"))})
	c.Settle(false) // failed or uncertain: the engine may hold v3 or not
	if c.Holds(kv.PutIfAbsent(k, nil)) || c.Holds(cas("v3")) {
		t.Fatal("key of a failed transaction still proves conditions")
	}
	c.Wrote([]kv.Op{kv.PutIfAbsent(k, []byte("v4"))})
	c.Discard()
	c.Settle(true)
	if c.Holds(cas("v4")) {
		t.Fatal("discarded write became known")
	}
	for _, key := range []string{"a", "b", "c", "d", "e"} {
		c.Wrote([]kv.Op{kv.PutIfAbsent([]byte(key), []byte("v"))})
		c.Settle(true)
	}
	if c.lru.Len() != 4 {
		t.Fatalf("cache holds %d entries, bound 4", c.lru.Len())
	}
}

func TestCondCacheFollowsPlainWrites(t *testing.T) {
	c := New(8)
	k := []byte("k")
	c.Wrote([]kv.Op{kv.Put([]byte("history"), []byte("x"))})
	c.Settle(true)
	if c.lru.Contains("history") {
		t.Fatal("a key written without a condition and unknown before was cached")
	}
	c.Wrote([]kv.Op{kv.PutIfAbsent(k, []byte("v1"))})
	c.Settle(true)
	c.Wrote([]kv.Op{kv.Put(k, []byte("v2"))}) // a plain write to a known key
	c.Settle(true)
	if c.Holds(kv.CompareAndSwap(k, []byte("v1"), nil)) || !c.Holds(kv.CompareAndSwap(k, []byte("v2"), nil)) {
		t.Fatal("a plain write to a known key left its entry stale")
	}
	c.Wrote([]kv.Op{kv.Delete(k)})
	c.Settle(true)
	if c.Holds(kv.CompareAndSwap(k, []byte("v2"), nil)) || !c.Holds(kv.PutIfAbsent(k, nil)) {
		t.Fatal("a plain delete of a known key left its entry stale")
	}
}
