package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/tso"
	"github.com/engramkv/engram/core/kv"
)

// Export reads the store as the key bucket of an etcd backend that was
// compacted at the current compacted revision C and is at revision rev
// (0 = the current revision): every version above C up to rev, tombstones
// included, and among them those a later change of the same key in the same
// transaction superseded (etcd writes each change under its own sub
// revision; they come from the change log, see superseded); each key's
// latest version at or below C while it is live; and each key's first
// delete at exactly C (etcd 3.6's compaction keeps it). That is what an etcd
// snapshot holds, what HashKV hashes, and all a restored store needs to
// serve reads and watches from C on.
//
// Rows come key by key, each key's versions in revision order, not in
// revision order overall (package etcdfmt's Sorter puts them in order). A
// key's latest version at or below rev has Latest set when it is exported.
// The fn's *Entry, and the buffer its key is in, are reused after fn
// returns: fn copies what it keeps (every caller hands the row to a sorter,
// which does).
//
// The read is consistent: it pins C, so physical compaction cannot remove
// what it reads, and it reads the latest records before history, so a
// version that a concurrent write moves into history is seen in one place or
// both (and deduplicated), never in neither.
func Export(ctx context.Context, b *mvcc.Backend, rev int64, fn func(*etcdfmt.Entry) error) (ExportInfo, error) {
	cur, compact, unpin, err := b.PinHistory(ctx)
	if err != nil {
		return ExportInfo{}, err
	}
	defer unpin()
	if rev > cur {
		return ExportInfo{}, mvcc.ErrFutureRev
	}
	if rev <= 0 {
		rev = cur
	}
	if rev < compact {
		return ExportInfo{}, mvcc.ErrCompacted
	}
	x := exporter{records: b.Records(), rev: rev, compact: compact, fn: fn}
	if err := x.deletesAtCompact(ctx); err != nil {
		return ExportInfo{}, err
	}
	if err := x.keys(ctx); err != nil {
		return ExportInfo{}, err
	}
	if err := x.superseded(ctx); err != nil {
		return ExportInfo{}, err
	}
	leases, err := b.StoredLeases(ctx)
	if err != nil {
		return ExportInfo{}, err
	}
	return ExportInfo{Rev: rev, CurrentRev: cur, CompactRev: compact, Rows: x.rows, Leases: leases}, nil
}

// ExportInfo describes one export.
type ExportInfo struct {
	// Rev is the revision exported; CurrentRev the store's revision when
	// the export started; CompactRev the compacted revision (0: never).
	Rev, CurrentRev, CompactRev int64
	// Rows is the number of rows exported.
	Rows int64
	// Leases are the leases stored when the export finished.
	Leases []etcdfmt.Lease
}

type exporter struct {
	records      mvcc.RecordReader
	rev, compact int64
	fn           func(*etcdfmt.Entry) error
	row          etcdfmt.Entry
	rows         int64
	// subs caches the last change-log record read to find the sub revision
	// of a version written before sub revisions were recorded.
	subsRev int64
	subs    map[string]int64
}

func (x *exporter) emit(e *etcdfmt.Entry) error {
	x.rows++
	return x.fn(e)
}

// deletesAtCompact exports the deletes of revision compact that etcd's
// compaction keeps: of each key, only its first delete in that revision.
// (etcd keeps one version per key at or below the compacted revision: the
// last one of the generation that ends at or after it, and a key's first
// delete at C ends such a generation; storage/mvcc/key_index.go, compact.)
func (x *exporter) deletesAtCompact(ctx context.Context) error {
	if x.compact <= 1 {
		return nil
	}
	raw, err := x.records.Get(ctx, coder.EventKey(x.compact))
	if errors.Is(err, kv.ErrNotFound) {
		return nil
	}
	if err != nil {
		return mvcc.StorageError("read change log", err)
	}
	cs, err := mvcc.DecodeChanges(raw)
	if err != nil {
		return err
	}
	changes := map[string]int{}
	for _, c := range cs {
		changes[string(c.Key)]++
	}
	seen := map[string]bool{}
	for i, c := range cs {
		if !c.Deleted || seen[string(c.Key)] {
			continue
		}
		seen[string(c.Key)] = true
		sub := int64(i)
		if changes[string(c.Key)] == 1 {
			// A store imported from etcd logs at C only the changes
			// etcd's compaction kept, so a change's place in the record
			// need not be its sub revision; the version's own header
			// has it.
			if h, ok, err := x.storedAt(ctx, c.Key); err != nil {
				return err
			} else if ok && h.Sub != mvcc.SubUnknown {
				sub = h.Sub
			}
		}
		x.row = etcdfmt.Entry{Rev: etcdfmt.Revision{Main: x.compact, Sub: sub}, Tombstone: true}
		x.row.KV.Key, x.row.KV.ModRevision = c.Key, x.compact
		if err := x.emit(&x.row); err != nil {
			return err
		}
	}
	return nil
}

// storedAt returns the header of key's version at the compacted revision,
// if the store still holds it (the revision key of a deleted key may have
// been cleaned up).
func (x *exporter) storedAt(ctx context.Context, key []byte) (mvcc.Version, bool, error) {
	raw, err := x.records.Get(ctx, coder.ObjectKey(key, x.compact))
	inHistory := err == nil
	if errors.Is(err, kv.ErrNotFound) {
		raw, err = x.records.Get(ctx, coder.RevisionKey(key))
	}
	if errors.Is(err, kv.ErrNotFound) {
		return mvcc.Version{}, false, nil
	}
	if err != nil {
		return mvcc.Version{}, false, mvcc.StorageError(fmt.Sprintf("get %q@%d", key, x.compact), err)
	}
	h, _, err := mvcc.DecodeVersion(raw)
	if err != nil {
		return mvcc.Version{}, false, err
	}
	// The object key names its version's revision; the revision key may
	// hold a later one.
	return h, inHistory || h.ModRev == x.compact, nil
}

// superseded exports, for each revision above the compacted one up to rev,
// the changes that a later change of the same key in the same revision
// superseded. History keeps only a revision's last version of a key, but
// etcd's key bucket holds every change under its own (main, sub) revision
// until compaction removes it, so the change log supplies them: a delete is
// a tombstone, and a superseded put keeps its version record (change type
// 02, record.go).
func (x *exporter) superseded(ctx context.Context) error {
	from := max(x.compact+1, tso.FirstRevision+1)
	if from > x.rev {
		return nil
	}
	it, err := x.records.Scan(ctx, kv.ScanOptions{Start: coder.EventKey(from), End: coder.EventKey(x.rev + 1), BatchSize: 256})
	if err != nil {
		return mvcc.StorageError("scan change log", err)
	}
	defer it.Close()
	last := map[string]int{}
	for {
		batch, err := it.Next(ctx)
		if err != nil {
			return mvcc.StorageError("scan change log", err)
		}
		if len(batch) == 0 {
			return nil
		}
		for _, p := range batch {
			rev, err := coder.DecodeEventKey(p.Key)
			if err != nil {
				return err
			}
			// Most revisions change one key: counted, not decoded (a
			// decode allocated for every revision of a snapshot).
			if n, err := mvcc.ChangeCount(p.Value); err != nil || n < 2 {
				if err != nil {
					return err
				}
				continue
			}
			cs, err := mvcc.DecodeChanges(p.Value)
			if err != nil {
				return err
			}
			clear(last)
			for i, c := range cs {
				last[string(c.Key)] = i
			}
			if len(last) == len(cs) {
				continue
			}
			for i, c := range cs {
				if last[string(c.Key)] == i {
					continue
				}
				if err := x.supersededRow(rev, int64(i), c); err != nil {
					return err
				}
			}
		}
	}
}

// supersededRow exports change c, number sub of revision rev, that a later
// change of its key in the same revision superseded.
func (x *exporter) supersededRow(rev, sub int64, c mvcc.Change) error {
	x.row = etcdfmt.Entry{Rev: etcdfmt.Revision{Main: rev, Sub: sub}, Tombstone: c.Deleted}
	x.row.KV.Key, x.row.KV.ModRevision = c.Key, rev
	if !c.Deleted {
		if c.Superseded == nil {
			// Written before change records kept superseded puts
			// (change type 02): the version is gone, and the export
			// omits it as it always did.
			return nil
		}
		h, val, err := mvcc.DecodeVersion(c.Superseded)
		if err != nil {
			return err
		}
		x.row.KV.CreateRevision, x.row.KV.Version, x.row.KV.Lease, x.row.KV.Value = h.CreateRev, h.Version, h.Lease, val
	}
	return x.emit(&x.row)
}

// keys walks the latest records and history side by side, key by key. The
// latest records' snapshot is taken first (see Export).
func (x *exporter) keys(ctx context.Context) error {
	latest, err := openCursor(ctx, x.records, coder.SpaceRevision)
	if err != nil {
		return err
	}
	defer latest.close()
	hist, err := openCursor(ctx, x.records, coder.SpaceObject)
	if err != nil {
		return err
	}
	defer hist.close()
	var (
		versions []version
		keyBuf   []byte
	)
	for {
		lk, lok, err := latest.peekKey(ctx)
		if err != nil {
			return err
		}
		hk, hok, err := hist.peekKey(ctx)
		if err != nil {
			return err
		}
		if !lok && !hok {
			return nil
		}
		var key []byte
		switch {
		case !hok || lok && bytes.Compare(lk, hk) <= 0:
			key = lk
		default:
			key = hk
		}
		// One buffer for every key: emit copies what it keeps.
		keyBuf = append(keyBuf[:0], key...)
		key = keyBuf
		versions = versions[:0]
		for {
			k, ok, err := hist.peekKey(ctx)
			if err != nil {
				return err
			}
			if !ok || !bytes.Equal(k, key) {
				break
			}
			v, err := hist.takeVersion()
			if err != nil {
				return err
			}
			versions = append(versions, v)
		}
		if k, ok, _ := latest.peekKey(ctx); ok && bytes.Equal(k, key) {
			v, err := latest.takeVersion()
			if err != nil {
				return err
			}
			// The latest record may also be in history already (moved
			// there after the snapshot of latest records was taken).
			if n := len(versions); n == 0 || versions[n-1].hdr.ModRev < v.hdr.ModRev {
				versions = append(versions, v)
			}
		}
		if err := x.key(ctx, key, versions); err != nil {
			return err
		}
	}
}

// key exports one key's versions (ascending, deduplicated).
func (x *exporter) key(ctx context.Context, key []byte, versions []version) error {
	// Only versions up to rev exist for this export.
	n := len(versions)
	for n > 0 && versions[n-1].hdr.ModRev > x.rev {
		n--
	}
	versions = versions[:n]
	// Versions before the latest one at or below C are compacted.
	first := 0
	for i, v := range versions {
		if v.hdr.ModRev <= x.compact {
			first = i
		}
	}
	for i := first; i < len(versions); i++ {
		v := versions[i]
		if v.hdr.ModRev <= x.compact && v.hdr.Tombstone {
			// Compacted: a delete at or below C is not kept, except
			// at exactly C, which deletesAtCompact exported.
			continue
		}
		sub, err := x.sub(ctx, key, v.hdr)
		if err != nil {
			return err
		}
		x.row = etcdfmt.Entry{Rev: etcdfmt.Revision{Main: v.hdr.ModRev, Sub: sub}, Tombstone: v.hdr.Tombstone, Latest: i == len(versions)-1}
		x.row.KV.Key, x.row.KV.ModRevision = key, v.hdr.ModRev
		if !v.hdr.Tombstone {
			x.row.KV.CreateRevision, x.row.KV.Version, x.row.KV.Lease, x.row.KV.Value = v.hdr.CreateRev, v.hdr.Version, v.hdr.Lease, v.value
		}
		if err := x.emit(&x.row); err != nil {
			return err
		}
	}
	return nil
}

// sub returns a version's sub revision. Versions written before sub
// revisions were recorded take it from the change log, which still holds
// every revision from the compacted one on; older ones are taken as 0 (a
// collision then shows up as a duplicate revision when the rows are sorted).
func (x *exporter) sub(ctx context.Context, key []byte, h mvcc.Version) (int64, error) {
	if h.Sub != mvcc.SubUnknown {
		return h.Sub, nil
	}
	if h.ModRev < x.compact {
		return 0, nil
	}
	if x.subsRev != h.ModRev {
		raw, err := x.records.Get(ctx, coder.EventKey(h.ModRev))
		if err != nil {
			return 0, mvcc.StorageError(fmt.Sprintf("read change log at %d", h.ModRev), err)
		}
		cs, err := mvcc.DecodeChanges(raw)
		if err != nil {
			return 0, err
		}
		x.subsRev, x.subs = h.ModRev, make(map[string]int64, len(cs))
		for i, c := range cs {
			x.subs[string(c.Key)] = int64(i)
		}
	}
	return x.subs[string(key)], nil
}

// version is one decoded version record.
type version struct {
	hdr   mvcc.Version
	value []byte
}

// cursor walks one space of the store with one snapshot iterator, decoding
// the etcd key of each record so two spaces can be merged by key.
type cursor struct {
	space coder.Space
	it    kv.Iterator
	batch []kv.Pair
	pos   int
	done  bool
	// key and rev are the decoded current record's etcd key and, for
	// object keys, revision.
	key     []byte
	rev     int64
	decoded bool
}

func openCursor(ctx context.Context, s mvcc.RecordReader, space coder.Space) (*cursor, error) {
	it, err := s.Scan(ctx, kv.ScanOptions{Start: coder.Prefix(space), End: coder.SpaceEnd(space), BatchSize: 1024})
	if err != nil {
		return nil, mvcc.StorageError("scan", err)
	}
	return &cursor{space: space, it: it}, nil
}

func (c *cursor) close() { _ = c.it.Close() }

// peekKey returns the etcd key of the current record; ok is false at the end.
func (c *cursor) peekKey(ctx context.Context) ([]byte, bool, error) {
	for !c.done && c.pos >= len(c.batch) {
		b, err := c.it.Next(ctx)
		if err != nil {
			return nil, false, mvcc.StorageError("scan", err)
		}
		c.batch, c.pos, c.decoded = b, 0, false
		c.done = len(b) == 0
	}
	if c.done {
		return nil, false, nil
	}
	if !c.decoded {
		var err error
		if c.space == coder.SpaceObject {
			c.key, c.rev, err = coder.DecodeObjectKey(c.batch[c.pos].Key)
		} else {
			c.key, err = coder.DecodeRevisionKey(c.batch[c.pos].Key)
		}
		if err != nil {
			return nil, false, err
		}
		c.decoded = true
	}
	return c.key, true, nil
}

// takeVersion decodes the current record and moves past it. Call it only
// after peekKey returned ok.
func (c *cursor) takeVersion() (version, error) {
	p := c.batch[c.pos]
	c.pos++
	c.decoded = false
	h, val, err := mvcc.DecodeVersion(p.Value)
	if err != nil {
		return version{}, err
	}
	if c.space == coder.SpaceObject {
		// The object key names the version's revision.
		h.ModRev = c.rev
	}
	return version{hdr: h, value: val}, nil
}
