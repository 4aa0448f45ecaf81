package badger

import (
	"bytes"
	"context"
	"fmt"

	badgerdb "github.com/dgraph-io/badger/v3"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/batchiter"
)

// Scan opens an iterator over a read-only transaction, which is the
// snapshot: it is taken here, not on the first Next.
func (s *Store) Scan(ctx context.Context, opts kv.ScanOptions) (kv.Iterator, error) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.usable(); err != nil {
		return nil, err
	}
	sc := &scan{c: cursor{
		reverse: opts.Reverse,
		// Copying only the prefix is what makes counting cheap.
		valuePrefix: opts.ValuePrefix,
		start:       dataKey(opts.Start),
	}}
	c := &sc.c
	if len(opts.End) > 0 {
		c.end = dataKey(opts.End)
		if bytes.Compare(c.start, c.end) >= 0 {
			sc.Init((*readGate)(s), nil, opts)
			return sc, nil
		}
	}
	c.txn = s.db.NewTransaction(false)
	c.iter = c.txn.NewIterator(badgerdb.IteratorOptions{
		// Values are copied one by one into the batch; prefetching would
		// only add goroutines and copies.
		PrefetchValues: false,
		Reverse:        opts.Reverse,
		// Badger leaves out tables whose keys cannot share the prefix, so
		// a scan of one resource's keys merges only the tables that may
		// hold them.
		Prefix: commonPrefix(c.start, c.end),
		// Forward scans see every version, deleted ones included, and
		// stop at End themselves. Without it, badger skips deleted keys
		// inside Next, before the bound can be checked: a scan whose
		// range ends just before a run of deleted keys (a list next to a
		// resource that was just deleted, compaction reading the history
		// of a key next to compacted ones) walked the whole run, tens of
		// thousands of entries, on every call. Reverse scans (a last key,
		// limit 1) keep badger's own version handling.
		AllVersions: !opts.Reverse,
	})
	if opts.Reverse {
		if c.end == nil {
			// Reverse Seek finds the last key <= its argument: the first
			// key past the data namespace lands on the last data key.
			c.iter.Seek([]byte{dataPrefix + 1})
		} else {
			c.iter.Seek(c.end)
			if c.iter.Valid() && bytes.Equal(c.iter.Item().Key(), c.end) {
				c.iter.Next() // End is exclusive
			}
		}
	} else {
		c.iter.Seek(c.start)
	}
	sc.Init((*readGate)(s), c, opts)
	s.iters.Add(&sc.Iterator)
	return sc, nil
}

// scan is a scan's iterator and its cursor, allocated together.
type scan struct {
	batchiter.Iterator
	c cursor
}

// readGate is the Store as a batchiter.Gate: an iterator reads only while
// the store is usable, and holds off Close while it does.
type readGate Store

func (g *readGate) Enter() error {
	s := (*Store)(g)
	s.gate.RLock()
	if err := s.usable(); err != nil {
		s.gate.RUnlock()
		return err
	}
	return nil
}

func (g *readGate) Exit() { g.gate.RUnlock() }

// cursor is a scan's batchiter.Source: a badger iterator over the
// snapshot, in the data namespace.
type cursor struct {
	txn        *badgerdb.Txn
	iter       *badgerdb.Iterator
	start, end []byte // in the data namespace; end nil when unbounded
	reverse    bool
	// valuePrefix > 0 truncates values (kv.ScanOptions.ValuePrefix).
	valuePrefix int
	// lastKey is the key of the previous version a forward scan saw (seen
	// tells an empty key from none).
	lastKey []byte
	seen    bool
}

// commonPrefix is the longest prefix every key in [start, end) shares; with
// no end it is the namespace byte of start.
func commonPrefix(start, end []byte) []byte {
	if end == nil {
		return start[:1:1]
	}
	n := 0
	for n < len(start) && n < len(end) && start[n] == end[n] {
		n++
	}
	return start[:n:n]
}

func (c *cursor) Fill(b *kv.Batch, _ int) (bool, error) {
	for ; !b.Full(); c.iter.Next() {
		if !c.iter.Valid() {
			return true, nil
		}
		item := c.iter.Item()
		k := item.Key()
		if (c.reverse && bytes.Compare(k, c.start) < 0) || (!c.reverse && c.end != nil && bytes.Compare(k, c.end) >= 0) {
			return true, nil
		}
		if !c.reverse {
			// Versions of a key come newest first: the first one decides
			// whether the key exists in this snapshot, the rest are
			// history badger has not compacted away yet.
			if c.seen && bytes.Equal(k, c.lastKey) {
				continue
			}
			c.lastKey = append(c.lastKey[:0], k...)
			c.seen = true
			if item.IsDeletedOrExpired() {
				continue
			}
		}
		k = k[1:] // strip the namespace
		err := item.Value(func(v []byte) error {
			if c.valuePrefix > 0 && len(v) > c.valuePrefix {
				v = v[:c.valuePrefix]
			}
			b.Add(k, v)
			return nil
		})
		if err != nil {
			return false, fmt.Errorf("badger: scan: read value of %q: %w", k, err)
		}
	}
	return false, nil
}

func (c *cursor) Release() {
	c.iter.Close()
	c.txn.Discard()
	c.iter, c.txn = nil, nil
}
