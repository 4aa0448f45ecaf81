package mvcc

import (
	"bytes"
	"sort"
	"sync"
)

// countCache remembers, for a range end and a revision, the live keys a full
// scan found, so later pages of the same paginated list can be counted by
// binary search instead of by scanning the rest of the range again.
//
// Why it is always correct: the keys live at a revision never change (that
// is what MVCC means), and a read below the compacted revision fails before
// it gets here. kube-apiserver pins every page after the first to the first
// page's revision and continues from lastKey+"\x00" with the same range end,
// so page k hits the entry the first page filled. Without it, counting made
// a list of n keys in pages of l cost about n*n/(2l) key visits.
//
// Invariant: an entry (end, rev, from) holds, sorted, the revision keys of
// every key live at rev in [from, end); a lookup with start >= from counts
// the entries >= start.
type countCache struct {
	mu      sync.Mutex
	entries []*countEntry // most recently used last
	keys    int           // total keys held
	maxKeys int
}

type countEntry struct {
	end  string
	rev  int64
	from []byte   // revision key the scan started at
	keys [][]byte // revision keys of the live keys, ascending
}

const (
	countCacheEntries = 32
	// A paginated list is worth remembering only when the range is much
	// larger than a page.
	countCacheMinKeys = 2048
)

func newCountCache(maxKeys int) *countCache {
	return &countCache{maxKeys: maxKeys}
}

// count returns the number of live keys at rev in [start, end), where start
// and end are revision keys, if a cached scan covers it.
func (c *countCache) count(end []byte, rev int64, start []byte) (int, bool) {
	if c == nil {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.entries) - 1; i >= 0; i-- {
		e := c.entries[i]
		if e.rev != rev || e.end != string(end) || bytes.Compare(start, e.from) < 0 {
			continue
		}
		c.entries = append(append(c.entries[:i:i], c.entries[i+1:]...), e)
		n := sort.Search(len(e.keys), func(j int) bool { return bytes.Compare(e.keys[j], start) >= 0 })
		return len(e.keys) - n, true
	}
	return 0, false
}

// add remembers a full scan's live keys.
func (c *countCache) add(end []byte, rev int64, from []byte, keys [][]byte) {
	if c == nil || len(keys) < countCacheMinKeys || len(keys) > c.maxKeys {
		return
	}
	// The keys point into the scan's batches, which hold values too; one
	// compact copy keeps the entry from pinning every value of the range.
	n := 0
	for _, k := range keys {
		n += len(k)
	}
	arena := make([]byte, 0, n)
	for i, k := range keys {
		arena = append(arena, k...)
		keys[i] = arena[len(arena)-len(k) : len(arena) : len(arena)]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = append(c.entries, &countEntry{end: string(end), rev: rev, from: bytes.Clone(from), keys: keys})
	c.keys += len(keys)
	for len(c.entries) > countCacheEntries || c.keys > c.maxKeys {
		c.keys -= len(c.entries[0].keys)
		c.entries = c.entries[1:]
	}
}

// dropBelow forgets scans at revisions below rev (compacted away).
func (c *countCache) dropBelow(rev int64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.entries[:0]
	for _, e := range c.entries {
		if e.rev >= rev {
			kept = append(kept, e)
		} else {
			c.keys -= len(e.keys)
		}
	}
	c.entries = kept
}
