package transfer

import (
	"context"
	"errors"
	"fmt"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/tso"
	"github.com/engramkv/engram/core/kv"
)

// Writing imported rows: each row moves the key's previous version into
// history as the writer would, and batches end only at revision boundaries,
// each carrying the import record with the last revision it completes.

// Lease imports (or updates) a lease with its granted TTL. Import leases
// before the rows attached to them.
func (im *Importer) Lease(id, ttl int64) error {
	if id == 0 {
		// 0 means "no lease" in every record; etcd grants any other ID,
		// negative ones included, so a source may hold them.
		return fmt.Errorf("mvcc: import: lease ID 0 names no lease")
	}
	if ttl <= 0 {
		return fmt.Errorf("mvcc: import: lease %x has TTL %d", id, ttl)
	}
	im.leases[id] = true
	im.add(kv.Put(coder.LeaseKey(id), mvcc.LeaseRecord(ttl)))
	return nil
}

// DropLease removes an imported lease (revoked at the source). Its keys'
// deletes arrive as rows.
func (im *Importer) DropLease(id int64) {
	delete(im.leases, id)
	im.add(kv.Delete(coder.LeaseKey(id)))
}

// HasLease reports whether lease id was imported.
func (im *Importer) HasLease(id int64) bool { return im.leases[id] }

// Add imports one version. Rows must come in revision order (main, then
// sub); rows at or below the compacted revision may be sparse.
func (im *Importer) Add(ctx context.Context, e *etcdfmt.Entry) error {
	r := e.Rev
	if r.Main <= im.record.Applied || r.Main < im.cur || r.Main == im.cur && r.Sub <= im.curSub && im.open {
		return fmt.Errorf("mvcc: import: revision %d/%d out of order (after %d/%d)", r.Main, r.Sub, im.cur, im.curSub)
	}
	if r.Main < tso.FirstRevision+1 {
		return fmt.Errorf("mvcc: import: revision %d is below the first write's revision %d", r.Main, tso.FirstRevision+1)
	}
	if len(e.KV.Key) == 0 {
		return fmt.Errorf("mvcc: import: empty key at revision %d/%d", r.Main, r.Sub)
	}
	if !e.Tombstone && (e.KV.CreateRevision <= 0 || e.KV.CreateRevision > r.Main || e.KV.Version < 0 || e.KV.Version == 0 && !im.countVersions || e.KV.ModRevision != r.Main) {
		return fmt.Errorf("mvcc: import: key %q at revision %d/%d has create_revision %d, mod_revision %d, version %d", e.KV.Key, r.Main, r.Sub, e.KV.CreateRevision, e.KV.ModRevision, e.KV.Version)
	}
	if r.Main != im.cur {
		if err := im.endRevision(ctx); err != nil {
			return err
		}
		if err := im.fillLog(ctx, r.Main-1); err != nil {
			return err
		}
		im.cur = r.Main
	}
	im.curSub, im.open = r.Sub, true
	key := e.KV.Key
	s, err := im.state(ctx, key)
	if err != nil {
		return err
	}
	h := mvcc.Version{ModRev: r.Main, Sub: r.Sub, Tombstone: e.Tombstone}
	if !e.Tombstone {
		h.CreateRev, h.Version, h.Lease = e.KV.CreateRevision, e.KV.Version, e.KV.Lease
		if h.Version == 0 {
			// CountVersions: the source does not count them.
			h.Version = 1
			if s.exists && !s.cur.Tombstone {
				h.Version = s.cur.Version + 1
			}
		}
	}
	if s.stagedRev != r.Main {
		// The key's first change in this revision: the version it
		// replaces moves to history, and is the previous version of
		// every event of the key in this revision.
		s.stagedRev, s.before, s.change = r.Main, 0, -1
		if s.exists {
			im.add(kv.Put(coder.ObjectKey(key, s.cur.ModRev), mvcc.EncodeVersion(s.cur, s.value)))
			if !s.cur.Tombstone {
				s.before = s.cur.ModRev
			}
		}
	} else if !s.cur.Tombstone && s.change >= 0 {
		// One transaction changed the key again (etcd's bucket holds
		// both under their sub revisions): history keeps only the
		// revision's last version, so the superseded put's change
		// keeps it, as the writer does (group.go, stageVersion).
		im.changes[s.change].Superseded = mvcc.EncodeVersion(s.cur, s.value)
	}
	value := e.KV.Value
	if e.Tombstone {
		value = nil
	}
	im.add(kv.Put(coder.RevisionKey(key), mvcc.EncodeVersion(h, value)))
	if r.Main >= im.firstLogged() {
		c := mvcc.Change{Deleted: e.Tombstone, Key: append([]byte(nil), key...)}
		// A put that creates the key has no previous version.
		if e.Tombstone || h.Version > 1 {
			c.PrevRev = s.before
		}
		s.change = len(im.changes)
		im.changes = append(im.changes, c)
	}
	// The lease index follows the latest live version's lease.
	newLease := int64(0)
	if !e.Tombstone && im.leases[h.Lease] {
		newLease = h.Lease
	}
	oldLease := int64(0)
	if s.leaseW {
		oldLease = s.cur.Lease
	}
	if oldLease != newLease {
		if oldLease != 0 {
			im.add(kv.Delete(coder.LeaseIndexKey(oldLease, key)))
		}
		if newLease != 0 {
			im.add(kv.Put(coder.LeaseIndexKey(newLease, key), nil))
		}
	}
	s.cur, s.value, s.exists, s.leaseW = h, append([]byte(nil), value...), true, newLease != 0
	return nil
}

// state returns key's latest imported version.
func (im *Importer) state(ctx context.Context, key []byte) (*importKey, error) {
	if s, ok := im.keys[string(key)]; ok {
		return s, nil
	}
	s := &importKey{}
	raw, err := im.store.Get(ctx, coder.RevisionKey(key))
	switch {
	case errors.Is(err, kv.ErrNotFound):
	case err != nil:
		return nil, mvcc.StorageError("read revision key", err)
	default:
		h, val, err := mvcc.DecodeVersion(raw)
		if err != nil {
			return nil, err
		}
		s.cur, s.value, s.exists = h, val, true
		if !h.Tombstone && h.Lease != 0 {
			_, err := im.store.Get(ctx, coder.LeaseIndexKey(h.Lease, key))
			switch {
			case err == nil:
				s.leaseW = true
			case !errors.Is(err, kv.ErrNotFound):
				return nil, mvcc.StorageError("read lease index", err)
			}
		}
	}
	im.keys[string(key)] = s
	return s, nil
}

func (im *Importer) add(op kv.Op) {
	if i, ok := im.opIndex[string(op.Key)]; ok {
		im.ops[i] = op
		return
	}
	im.opIndex[string(op.Key)] = len(im.ops)
	im.ops = append(im.ops, op)
	im.size += len(op.Key) + len(op.Value) + 16
}

// endRevision completes revision cur with its change-log record, and
// commits the batch if it is full: batches end only at revision boundaries.
func (im *Importer) endRevision(ctx context.Context) error {
	if !im.open {
		return nil
	}
	im.open = false
	if im.cur >= im.firstLogged() {
		im.add(kv.Put(coder.EventKey(im.cur), mvcc.EncodeChanges(im.changes)))
		im.logNext = im.cur + 1
	}
	im.changes = im.changes[:0]
	im.record.Applied = im.cur
	if im.size >= im.maxBytes {
		return im.flush(ctx)
	}
	return nil
}

// fillLog writes empty change-log records for the revisions up to and
// including rev that have none, committing full batches: no revision is
// open while it runs, and the revisions it fills have nothing to import.
func (im *Importer) fillLog(ctx context.Context, rev int64) error {
	if im.logNext == 0 {
		im.logNext = im.firstLogged()
	}
	for r := im.logNext; r <= rev; r++ {
		im.add(kv.Put(coder.EventKey(r), mvcc.EncodeChanges(nil)))
		im.logNext = r + 1
		if im.size >= im.maxBytes {
			im.record.Applied = max(im.record.Applied, r)
			if err := im.flush(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// Advance records that the source has nothing more to import up to rev
// (a migration learns it from the source's progress notifications): the
// revisions up to rev get their (empty) change-log records.
func (im *Importer) Advance(ctx context.Context, rev int64) error {
	if rev <= im.cur {
		return nil
	}
	if err := im.endRevision(ctx); err != nil {
		return err
	}
	if err := im.fillLog(ctx, rev); err != nil {
		return err
	}
	im.cur, im.curSub = rev, 0
	im.record.Applied = rev
	return nil
}

// Flush completes the current revision and commits everything added so far
// with the import record.
func (im *Importer) Flush(ctx context.Context) error {
	if err := im.endRevision(ctx); err != nil {
		return err
	}
	return im.flush(ctx)
}

func (im *Importer) flush(ctx context.Context) error {
	op, err := mvcc.ImportRecordOp(im.record)
	if err != nil {
		return err
	}
	im.add(op)
	if err := im.store.Commit(ctx, im.ops); err != nil {
		return mvcc.StorageError(fmt.Sprintf("import up to revision %d", im.record.Applied), err)
	}
	im.ops, im.size = im.ops[:0], 0
	clear(im.opIndex)
	clear(im.keys)
	return nil
}
