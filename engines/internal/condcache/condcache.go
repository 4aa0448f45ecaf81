// Package condcache lets an embedded engine's single committer prove the
// conditions of a batch (put-if-absent, compare-and-swap, compare-and-delete)
// true from digests of what it last wrote, without reading the engine.
//
// It owns only that memory of recent writes. It must not be used by an
// adaptor whose committer is not the engine's only writer (the badger and
// pebble adaptors hold their directory's lock), and it never decides a
// conflict: a condition it cannot prove is read from the engine, so a
// conflict and its current value always come from there.
package condcache

import (
	"hash/maphash"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/engramkv/engram/core/kv"
)

// Cache lets the committer check a batch's conditions without reading the
// engine. Every condition (put-if-absent, compare-and-swap of the revision
// key the core read) names a key that was usually written moments before,
// and looking it up searches the engine's memtables and, once they were
// flushed, its newest tables, a measurable share of the server's CPU
// (DESIGN.md, "The condition cache"). The committer is the only writer of the
// database (the engine holds the directory lock), so it knows what it last
// wrote to each key.
//
// It remembers, for recently written keys, a 128-bit digest of the value it
// wrote, or that it deleted the key. A condition that holds by the digest is
// not read from the engine; one that does not, or a key it does not know, is
// read as before, so a conflict and its current value always come from the
// engine. A wrong "holds" would need a 128-bit collision between the
// expected and the written value under a per-process random seed.
//
// Invariants: only the committer goroutine touches it (no locks); a key's
// entry changes only after the transaction that wrote it committed; a
// transaction that failed, or whose outcome is uncertain, removes its keys,
// because the engine may or may not hold their new values.
type Cache struct {
	seeds [2]maphash.Seed
	lru   *simplelru.LRU[string, digest]
	// pending holds the writes of the transaction being built, which the
	// conditions of its later batches must see.
	pending map[string]digest
}

type digest struct {
	h       [2]uint64
	deleted bool
}

// DefaultEntries bounds the cache to about 25 MiB (a 70-byte key,
// the digest and the LRU's map and list entries take about 200 bytes).
const DefaultEntries = 128 << 10

// New returns a cache of at most entries keys; nil (which proves nothing and
// records nothing) when entries is not positive.
func New(entries int) *Cache {
	if entries <= 0 {
		return nil
	}
	lru, _ := simplelru.NewLRU[string, digest](entries, nil)
	return &Cache{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, lru: lru, pending: map[string]digest{}}
}

func (c *Cache) digestOf(v []byte) digest {
	return digest{h: [2]uint64{maphash.Bytes(c.seeds[0], v), maphash.Bytes(c.seeds[1], v)}}
}

// Holds reports whether the cache proves op's condition true; false means
// "read the engine", not "conflict".
func (c *Cache) Holds(op kv.Op) bool {
	if c == nil {
		return false
	}
	d, ok := c.pending[string(op.Key)]
	if !ok {
		if d, ok = c.lru.Get(string(op.Key)); !ok {
			return false
		}
	}
	switch op.Kind {
	case kv.OpPutIfAbsent:
		return d.deleted
	case kv.OpCompareAndSwap, kv.OpCompareAndDelete:
		return !d.deleted && d.h == c.digestOf(op.Expected).h
	}
	return false
}

// Wrote records a batch's writes as pending in the current transaction.
// Keys written without a condition (the core's history and its compaction)
// are remembered only when already known, so that an entry never goes stale;
// keys written under a condition are the ones conditions name again.
func (c *Cache) Wrote(ops []kv.Op) {
	if c == nil {
		return
	}
	for _, op := range ops {
		if !op.Kind.Conditional() {
			if _, ok := c.pending[string(op.Key)]; !ok && !c.lru.Contains(string(op.Key)) {
				continue
			}
		}
		if op.Kind == kv.OpDelete || op.Kind == kv.OpCompareAndDelete {
			c.pending[string(op.Key)] = digest{deleted: true}
		} else {
			c.pending[string(op.Key)] = c.digestOf(op.Value)
		}
	}
}

// Settle ends the transaction: its writes become known when it committed,
// and unknown when it failed or its outcome is uncertain.
func (c *Cache) Settle(committed bool) {
	if c == nil {
		return
	}
	for k, d := range c.pending {
		if committed {
			c.lru.Add(k, d)
		} else {
			c.lru.Remove(k)
		}
	}
	clear(c.pending)
}

// Discard drops the pending writes of a transaction that was never
// committed (the engine refused a write part-way; the group is replayed).
func (c *Cache) Discard() {
	if c != nil {
		clear(c.pending)
	}
}
