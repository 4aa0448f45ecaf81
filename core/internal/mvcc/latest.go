package mvcc

import (
	"context"
	"errors"
	"sync"
	"unsafe"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// The latest-record cache keeps recently used revision-key records (a key's
// latest version, exactly the bytes stored) in memory on the node that
// writes, so that a point read, and the writer's evaluation of a compare or
// a CAS, cost no engine lookup: on badger a search of the memtable and the
// LSM levels, on TiKV or a remote wasm engine a network round trip. What it
// saves, measured: (DESIGN.md, "The latest-record cache").
//
// Invariants:
//
//   - Only the writer changes revision keys, and it updates or invalidates
//     the cache for every key of a batch after the batch committed (or
//     failed, or was uncertain) and before the revision is published. So an
//     entry is never older than the latest revision a reader can observe;
//     an entry newer than the reader's revision is resolved through history
//     as a store read would be.
//   - A reader that missed may fill the cache with what it read from the
//     store only if the writer changed nothing since it started reading
//     (gen), and only where there is no entry: a fill can never bring back a
//     version the writer already replaced.
//   - A follower (ReadOnly) has no cache: another node writes.
//
// The cache holds bytes the store returned or the writer encoded; nobody
// modifies them after insertion.
type latestCache struct {
	mu     sync.Mutex
	lru    *simplelru.LRU[string, []byte]
	bytes  int64
	limit  int64
	maxRec int
	gen    uint64

	hits, misses uint64 // read under mu by metrics
}

// latestEntryOverhead approximates the map, list and string headers of one
// entry, so that many small records are accounted for honestly.
const latestEntryOverhead = 128

func newLatestCache(limit int64) *latestCache {
	c := &latestCache{limit: limit, maxRec: int(min(limit/64, 256<<10))}
	// The LRU bounds entries by count; the byte budget is enforced here.
	c.lru, _ = simplelru.NewLRU[string, []byte](1<<62, func(k string, v []byte) {
		c.bytes -= int64(len(k) + len(v) + latestEntryOverhead)
	})
	return c
}

// get returns key's cached record and the generation to pass to fill when it
// misses.
func (c *latestCache) get(key []byte) (raw []byte, ok bool, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	raw, ok = c.lru.Get(lookupString(key))
	if ok {
		c.hits++
	} else {
		c.misses++
	}
	return raw, ok, c.gen
}

// fill caches what a reader found in the store, unless the writer changed
// anything since gen or the key is cached already.
func (c *latestCache) fill(key, raw []byte, gen uint64) {
	if len(raw) > c.maxRec {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen || c.lru.Contains(lookupString(key)) {
		return
	}
	c.insert(string(key), raw)
}

// set records the writer's committed record for key.
func (c *latestCache) set(key string, raw []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	if len(raw) > c.maxRec {
		c.lru.Remove(key)
		return
	}
	c.insert(key, raw)
}

// invalidate forgets key; the writer calls it when the key's record is gone
// or its state in the store is unknown.
func (c *latestCache) invalidate(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.lru.Remove(key)
}

// insert adds or replaces an entry; c.mu is held. A replaced entry is
// updated in place (Add moves it to the front without the eviction
// callback), which costs neither a map deletion nor a new list entry: an
// update of a cached key is the writer's commonest insert.
func (c *latestCache) insert(key string, raw []byte) {
	if old, ok := c.lru.Peek(key); ok {
		c.bytes -= int64(len(key) + len(old) + latestEntryOverhead)
	}
	c.lru.Add(key, raw)
	c.bytes += int64(len(key) + len(raw) + latestEntryOverhead)
	for c.bytes > c.limit {
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break
		}
	}
}

func (c *latestCache) stats() (hits, misses uint64, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.bytes
}

// latestRecord returns key's revision-key record, from the cache when it has
// one. kv.ErrNotFound means the key has no revision key.
func (b *Backend) latestRecord(ctx context.Context, key []byte) ([]byte, error) {
	raw, ok, gen := b.cachedRecord(key)
	if ok {
		return raw, nil
	}
	return b.storeRecord(ctx, key, gen)
}

// cachedRecord returns key's revision-key record if the latest-record cache
// holds it, and otherwise the generation storeRecord fills the cache at.
func (b *Backend) cachedRecord(key []byte) (raw []byte, ok bool, gen uint64) {
	if b.latest == nil {
		return nil, false, 0
	}
	return b.latest.get(key)
}

// storeRecord reads key's revision-key record from the engine after the
// cache missed at gen, and fills the cache with it.
func (b *Backend) storeRecord(ctx context.Context, key []byte, gen uint64) ([]byte, error) {
	raw, err := b.store.Get(ctx, coder.RevisionKey(key))
	if err == nil {
		if b.latest != nil {
			b.latest.fill(key, raw, gen)
		}
	} else if !errors.Is(err, kv.ErrNotFound) {
		return nil, err
	}
	return raw, err
}

// lookupString views key as a string for a lookup that keeps nothing (the
// LRU's Get and Contains): a conversion would allocate a copy per lookup,
// one per point read and per write.
func lookupString(key []byte) string { return unsafe.String(unsafe.SliceData(key), len(key)) }
