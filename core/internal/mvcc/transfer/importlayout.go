package transfer

import (
	"bytes"
	"context"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/mvcc"
)

// keyLayout derives the records of an imported history from its versions
// in key order (each key's versions in revision order), one key at a time,
// so that it needs no state beyond the key at hand. It produces what the
// Importer's Add produces from the same versions in revision order (the
// bulk path's tests compare the two stores): history for every version a
// later revision superseded, the latest record, one change per version
// from the first logged revision on, and the lease index entry of a live
// latest version whose lease was imported.
//
// Each callback may be nil; the byte slices it gets are valid only during
// the call.
type keyLayout struct {
	firstLogged int64
	leases      map[int64]bool

	latest     func(key, record []byte) error
	history    func(key []byte, rev int64, record []byte) error
	change     func(main, sub int64, c *mvcc.Change) error
	leaseIndex func(lease int64, key []byte) error

	key    []byte
	exists bool
	cur    mvcc.Version
	// record is cur's version record, encoded when it arrives: the
	// history, the latest record and a superseded change all take it as
	// it is.
	record []byte
	// stagedRev is the main revision of the key's last version; before the
	// revision of its live version before stagedRev (0: none).
	stagedRev, before int64
	// pending is the change of the key's last version, held back because a
	// later version in the same revision may supersede it.
	pending    mvcc.Change
	pendingRev etcdfmt.Revision
	hasPending bool
	scratch    []byte
}

// run feeds every row of sorted (a key sorter) through the layout.
func (l *keyLayout) run(ctx context.Context, sorted *etcdfmt.Sorter) error {
	l.exists = false
	if err := sorted.Each(ctx, l.version); err != nil {
		return err
	}
	if l.exists {
		return l.endKey()
	}
	return nil
}

func (l *keyLayout) version(e *etcdfmt.Entry) error {
	if l.exists && !bytes.Equal(e.KV.Key, l.key) {
		if err := l.endKey(); err != nil {
			return err
		}
		l.exists = false
	}
	if !l.exists {
		l.key = append(l.key[:0], e.KV.Key...)
		l.stagedRev = 0
	}
	r := e.Rev
	if l.stagedRev != r.Main {
		// The key's first change in this revision: the version it
		// replaces becomes history and the previous version of every
		// change of the key in this revision.
		if err := l.flushChange(); err != nil {
			return err
		}
		l.stagedRev, l.before = r.Main, 0
		if l.exists {
			if l.history != nil {
				if err := l.history(l.key, l.cur.ModRev, l.record); err != nil {
					return err
				}
			}
			if !l.cur.Tombstone {
				l.before = l.cur.ModRev
			}
		}
	} else if !l.cur.Tombstone && l.hasPending {
		// One transaction changed the key again: history keeps only the
		// revision's last version, and the superseded put's change
		// carries it (as in Add).
		l.scratch = append(l.scratch[:0], l.record...)
		l.pending.Superseded = l.scratch
	}
	h := mvcc.Version{ModRev: r.Main, Sub: r.Sub, Tombstone: e.Tombstone}
	if !e.Tombstone {
		h.CreateRev, h.Version, h.Lease = e.KV.CreateRevision, e.KV.Version, e.KV.Lease
	}
	if r.Main >= l.firstLogged {
		if err := l.flushChange(); err != nil {
			return err
		}
		l.pending = mvcc.Change{Deleted: e.Tombstone, Key: l.key}
		if e.Tombstone || h.Version > 1 {
			l.pending.PrevRev = l.before
		}
		l.pendingRev, l.hasPending = r, true
	}
	l.cur, l.exists = h, true
	var value []byte
	if !e.Tombstone {
		value = e.KV.Value
	}
	l.record = mvcc.AppendVersion(l.record[:0], h, value)
	return nil
}

// endKey writes what the key's last version decides.
func (l *keyLayout) endKey() error {
	if err := l.flushChange(); err != nil {
		return err
	}
	if l.latest != nil {
		if err := l.latest(l.key, l.record); err != nil {
			return err
		}
	}
	if l.leaseIndex != nil && !l.cur.Tombstone && l.leases[l.cur.Lease] {
		return l.leaseIndex(l.cur.Lease, l.key)
	}
	return nil
}

func (l *keyLayout) flushChange() error {
	if !l.hasPending {
		return nil
	}
	l.hasPending = false
	if l.change == nil {
		return nil
	}
	return l.change(l.pendingRev.Main, l.pendingRev.Sub, &l.pending)
}
