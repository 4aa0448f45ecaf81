package pebble

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/batchiter"
)

// Scan opens a pebble iterator, which is the snapshot: it reads at the
// sequence number current here, not at the first Next.
func (s *Store) Scan(ctx context.Context, opts kv.ScanOptions) (kv.Iterator, error) {
	if err := s.gate.Enter(); err != nil {
		return nil, err
	}
	defer s.gate.Exit()
	iopts := &pebbledb.IterOptions{LowerBound: bytes.Clone(opts.Start)}
	if len(opts.End) > 0 {
		if opts.Start != nil && bytes.Compare(opts.Start, opts.End) >= 0 {
			it := new(scan)
			it.Init(&s.gate, nil, opts)
			return it, nil
		}
		// Bounds let pebble skip tables outside the range and stop at the
		// end by itself, also in the middle of a run of deleted keys.
		iopts.UpperBound = bytes.Clone(opts.End)
	}
	iter, err := s.db.NewIter(iopts)
	if err != nil {
		return nil, fmt.Errorf("pebble: scan: %w", err)
	}
	sc := &scan{c: cursor{
		log:     s.log,
		iter:    iter,
		reverse: opts.Reverse,
		// Copying only the prefix is what makes counting cheap.
		valuePrefix: opts.ValuePrefix,
	}}
	sc.Init(&s.gate, &sc.c, opts)
	s.iters.Add(&sc.Iterator)
	return sc, nil
}

// scan is a scan's iterator and its cursor, allocated together.
type scan struct {
	batchiter.Iterator
	c cursor
}

// cursor is a scan's batchiter.Source: a pebble iterator bounded to the
// scan's range.
type cursor struct {
	log        *slog.Logger
	iter       *pebbledb.Iterator
	positioned bool // the first Fill has placed iter on the first pair
	reverse    bool
	// valuePrefix > 0 truncates values (kv.ScanOptions.ValuePrefix).
	valuePrefix int
}

func (c *cursor) Fill(b *kv.Batch, _ int) (bool, error) {
	valid := c.step()
	for ; valid; valid = c.step() {
		v, err := c.iter.ValueAndErr()
		if err != nil {
			return false, fmt.Errorf("pebble: scan: read value of %q: %w", c.iter.Key(), err)
		}
		if c.valuePrefix > 0 && len(v) > c.valuePrefix {
			v = v[:c.valuePrefix]
		}
		b.Add(c.iter.Key(), v)
		if b.Full() {
			return false, nil
		}
	}
	if err := c.iter.Error(); err != nil {
		return false, fmt.Errorf("pebble: scan: %w", err)
	}
	return true, nil
}

// step moves to the next pair in the scan's direction (the first on the
// first call) and reports whether there is one.
func (c *cursor) step() bool {
	if !c.positioned {
		c.positioned = true
		if c.reverse {
			return c.iter.Last()
		}
		return c.iter.First()
	}
	if c.reverse {
		return c.iter.Prev()
	}
	return c.iter.Next()
}

func (c *cursor) Release() {
	if err := c.iter.Close(); err != nil {
		c.log.Warn("closing an iterator", "err", err)
	}
	c.iter = nil
}
