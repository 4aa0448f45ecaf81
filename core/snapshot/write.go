package snapshot

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/engramkv/engram/core/etcdfmt"
)

const (
	// txBytes is how many bytes of rows one bbolt transaction takes before
	// it is committed: a write transaction keeps every page it touches in
	// memory until commit.
	txBytes = 4 << 20
	// ctxCheckEvery is how many rows pass between context checks.
	ctxCheckEvery = 1024
	// initialMmapSize is the address space Write maps for the file from
	// the start.
	initialMmapSize = 1 << 30
	// arenaBytes is the size of the writer's row arena: a transaction's
	// rows and a little more, so one arena usually serves a transaction.
	arenaBytes = txBytes + txBytes/8
)

// WriteOptions describes the snapshot Write makes besides its rows.
type WriteOptions struct {
	// CompactRev is written as meta finishedCompactRev and
	// scheduledCompactRev; 0 or less: not written. A snapshot of only the
	// latest versions sets it to Revision, so that etcd starts at Revision
	// and treats older revisions as compacted.
	CompactRev int64
	// Revision is the revision the snapshot was taken at. etcd derives its
	// revision from the rows and CompactRev, so Write refuses a Revision the
	// file would not restore at; 0: whatever the rows say.
	Revision int64
	// Leases are written to the lease bucket.
	Leases []etcdfmt.Lease
	// Auth is written to the auth, authUsers and authRoles buckets; nil
	// (or an Auth with nothing in it): no auth buckets, as etcd restores a
	// file without them with auth off and no users.
	Auth *Auth
}

// term is the raft term written to meta; etcd's restore replaces it.
const term = 1

// Write creates path (which must not exist) holding an etcd 3.6 backend
// with the rows rows yields, which must come in revision order, and returns
// the file's Info, the same Info Open reports for it. On error the partial
// file is removed.
//
// Memory stays bounded whatever the number of rows: they are inserted in
// transactions of about txBytes, into a key bucket filled to 100% since
// rows only ever append. The file has no sha256 trailer (the Snapshot RPC
// sends its own); AppendTrailer adds one for `etcdutl snapshot restore`.
//
// Buckets: the auth buckets when opts.Auth holds anything, key (the rows),
// lease (opts.Leases) and meta with storageVersion
// 3.6.0, consistent_index (the revision) and term (1), plus
// finishedCompactRev and scheduledCompactRev when opts.CompactRev > 0.
// etcdutl's status and restore need no other bucket or meta key (restore
// creates members and cluster and rewrites consistent_index and term);
// consistent_index and term are written anyway so the file looks like any
// etcd backend to tools that read it directly.
func Write(ctx context.Context, path string, opts WriteOptions, rows func(yield func(*etcdfmt.Entry) error) error) (_ Info, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Info{}, fmt.Errorf("snapshot: write: %w", err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(path)
		return Info{}, fmt.Errorf("snapshot: write: %w", err)
	}
	// bbolt syncs on every commit unless NoSync; one sync at the end is
	// enough since a partial file is removed anyway.
	// A large initial mapping (address space, not memory) spares the
	// remaps bbolt does as the file grows, each of which copies every
	// node of the open transaction out of the old mapping: most of what
	// a snapshot allocated.
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true, InitialMmapSize: initialMmapSize})
	if err != nil {
		_ = os.Remove(path)
		return Info{}, fmt.Errorf("snapshot: write %s: %w", path, err)
	}
	w := &writer{ctx: ctx, db: db, ib: newInfoBuilder()}
	defer func() {
		if w.tx != nil {
			_ = w.tx.Rollback()
		}
		if w.db != nil {
			_ = w.db.Close()
		}
		if err != nil {
			_ = os.Remove(path)
			err = fmt.Errorf("snapshot: write %s: %w", path, err)
		}
	}()

	if err := w.begin(); err != nil {
		return Info{}, err
	}
	for _, name := range [][]byte{etcdfmt.BucketKey, etcdfmt.BucketMeta, etcdfmt.BucketLease} {
		if _, err := w.tx.CreateBucket(name); err != nil {
			return Info{}, fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	w.setKeys()
	// Buckets are hashed in name order: auth, authRoles, authUsers, key,
	// lease, meta.
	if !opts.Auth.Empty() {
		if err := w.putAuth(opts.Auth); err != nil {
			return Info{}, err
		}
	}
	w.ib.bucket(etcdfmt.BucketKey)
	if err := rows(w.add); err != nil {
		return Info{}, err
	}
	// rows may have dropped an error yield returned.
	if w.err != nil {
		return Info{}, w.err
	}

	rev := max(1, w.last.Main, opts.CompactRev)
	if opts.Revision > 0 && opts.Revision != rev {
		return Info{}, fmt.Errorf("revision %d cannot be restored from rows ending at %d and compact revision %d: etcd would start at %d (a snapshot of latest versions only sets CompactRev to the revision)",
			opts.Revision, w.last.Main, max(opts.CompactRev, 0), rev)
	}
	if err := w.putLeases(opts.Leases); err != nil {
		return Info{}, err
	}
	if err := w.putMeta(rev, opts.CompactRev); err != nil {
		return Info{}, err
	}
	if err := w.commit(); err != nil {
		return Info{}, err
	}
	var size int64
	_ = db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil })
	if err := db.Sync(); err != nil {
		return Info{}, fmt.Errorf("sync: %w", err)
	}
	w.db = nil
	if err := db.Close(); err != nil {
		return Info{}, fmt.Errorf("close: %w", err)
	}
	// bbolt grows its file ahead of use (by up to 16 MB); the pages past
	// the high-water mark are unused, and cutting them leaves the file
	// etcd's own snapshots are: exactly the pages in use.
	if err := truncateSync(path, size); err != nil {
		return Info{}, err
	}
	return w.ib.info(size, false), nil
}

// writer feeds rows into bbolt in bounded transactions.
type writer struct {
	ctx     context.Context
	db      *bolt.DB
	tx      *bolt.Tx
	keys    *bolt.Bucket
	pending int
	n       int64
	last    etcdfmt.Revision
	lastKey []byte
	ib      *infoBuilder
	err     error // first error add returned
	// arena holds the current transaction's bucket keys and values.
	arena []byte
}

func (w *writer) begin() error {
	tx, err := w.db.Begin(true)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	w.tx, w.pending = tx, 0
	// The last transaction is committed: bbolt copied its rows into
	// pages and holds no reference into the arena any more.
	w.arena = w.arena[:0]
	w.setKeys()
	return nil
}

// cut encodes e's bucket key and value into the arena. A row that does
// not fit starts a new, larger arena; the old one stays alive until the
// transaction commits, through bbolt's references into it.
func (w *writer) cut(e *etcdfmt.Entry) (k, v []byte) {
	need := etcdfmt.RevBytesLen + 1 + e.KV.MarshalBound()
	if cap(w.arena)-len(w.arena) < need {
		// Doubling up to a transaction's worth: a small snapshot
		// allocates little more than its rows.
		w.arena = make([]byte, 0, max(min(2*cap(w.arena), arenaBytes), need, 64<<10))
	}
	start := len(w.arena)
	w.arena = etcdfmt.AppendBucketKey(w.arena, e.Rev, e.Tombstone)
	mid := len(w.arena)
	w.arena = e.AppendBucketValue(w.arena)
	return w.arena[start:mid:mid], w.arena[mid:len(w.arena):len(w.arena)]
}

// setKeys looks the key bucket up in the current transaction (it is nil
// before the bucket is created).
func (w *writer) setKeys() {
	w.keys = w.tx.Bucket(etcdfmt.BucketKey)
	if w.keys != nil {
		// Rows only ever append, so pages filled to the brim never need
		// to split again; etcd's default of 50% would double the file.
		w.keys.FillPercent = 1.0
	}
}

func (w *writer) commit() error {
	tx := w.tx
	w.tx, w.keys = nil, nil
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// add is the yield function handed to rows.
func (w *writer) add(e *etcdfmt.Entry) error {
	if w.err != nil {
		return w.err
	}
	w.err = w.put(e)
	return w.err
}

func (w *writer) put(e *etcdfmt.Entry) error {
	if w.n%ctxCheckEvery == 0 {
		if err := w.ctx.Err(); err != nil {
			return err
		}
	}
	if err := checkRow(e); err != nil {
		return err
	}
	if w.n > 0 && !w.last.Less(e.Rev) {
		if e.Rev == w.last {
			return fmt.Errorf("revision %d/%d holds two rows, keys %q and %q", e.Rev.Main, e.Rev.Sub, w.lastKey, e.KV.Key)
		}
		return fmt.Errorf("row of key %q at revision %d/%d comes after revision %d/%d: rows must be in revision order",
			e.KV.Key, e.Rev.Main, e.Rev.Sub, w.last.Main, w.last.Sub)
	}
	// bbolt keeps references to both slices until the commit, so they
	// are cut from the transaction's arena, never the caller's buffers.
	k, v := w.cut(e)
	if err := w.keys.Put(k, v); err != nil {
		return fmt.Errorf("put revision %d/%d: %w", e.Rev.Main, e.Rev.Sub, err)
	}
	w.ib.row(k, v)
	w.ib.keyRow(e)
	w.ib.rows++
	w.n++
	w.last = e.Rev
	w.lastKey = append(w.lastKey[:0], e.KV.Key...)
	w.pending += len(k) + len(v)
	if w.pending >= txBytes {
		if err := w.commit(); err != nil {
			return err
		}
		return w.begin()
	}
	return nil
}

// checkRow rejects rows etcd could not read back.
func checkRow(e *etcdfmt.Entry) error {
	switch {
	case e.Rev.Main < 1 || e.Rev.Sub < 0:
		return fmt.Errorf("row of key %q has revision %d/%d", e.KV.Key, e.Rev.Main, e.Rev.Sub)
	case len(e.KV.Key) == 0:
		return fmt.Errorf("row at revision %d/%d has an empty key", e.Rev.Main, e.Rev.Sub)
	case !e.Tombstone && e.KV.ModRevision != e.Rev.Main:
		return fmt.Errorf("row of key %q at revision %d/%d has mod_revision %d", e.KV.Key, e.Rev.Main, e.Rev.Sub, e.KV.ModRevision)
	}
	return nil
}

func (w *writer) putLeases(leases []etcdfmt.Lease) error {
	type row struct{ k, v []byte }
	rs := make([]row, 0, len(leases))
	for _, l := range leases {
		rs = append(rs, row{etcdfmt.LeaseKey(l.ID), etcdfmt.EncodeLease(l)})
	}
	// Sorted as bbolt will store them, so the hash sees bbolt's order.
	slices.SortFunc(rs, func(a, b row) int { return bytes.Compare(a.k, b.k) })
	b := w.tx.Bucket(etcdfmt.BucketLease)
	w.ib.bucket(etcdfmt.BucketLease)
	for i, r := range rs {
		if i > 0 && bytes.Equal(r.k, rs[i-1].k) {
			return fmt.Errorf("lease %d given twice", int64(binary.BigEndian.Uint64(r.k)))
		}
		if err := b.Put(r.k, r.v); err != nil {
			return fmt.Errorf("put lease: %w", err)
		}
		w.ib.row(r.k, r.v)
	}
	return nil
}

func (w *writer) putMeta(rev, compactRev int64) error {
	ci := binary.BigEndian.AppendUint64(nil, uint64(rev))
	tm := binary.BigEndian.AppendUint64(nil, term)
	rows := [][2][]byte{
		{etcdfmt.MetaConsistentIndex, ci},
		{etcdfmt.MetaStorageVersion, []byte(etcdfmt.StorageVersion)},
		{etcdfmt.MetaTerm, tm},
	}
	if compactRev > 0 {
		cr := etcdfmt.EncodeRevision(etcdfmt.Revision{Main: compactRev})
		rows = append(rows, [2][]byte{etcdfmt.MetaFinishedCompactRev, cr}, [2][]byte{etcdfmt.MetaScheduledCompactRev, cr})
	}
	slices.SortFunc(rows, func(a, b [2][]byte) int { return bytes.Compare(a[0], b[0]) })
	b := w.tx.Bucket(etcdfmt.BucketMeta)
	w.ib.bucket(etcdfmt.BucketMeta)
	for _, r := range rows {
		if err := b.Put(r[0], r[1]); err != nil {
			return fmt.Errorf("put meta %s: %w", r[0], err)
		}
		w.ib.row(r[0], r[1])
		if err := w.ib.metaRow(r[0], r[1]); err != nil {
			return err
		}
	}
	return nil
}

// truncateSync cuts path to size and makes the file and its directory
// entry durable.
func truncateSync(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	return nil
}

// AppendTrailer appends the sha256 of path's contents to it, as `etcdctl
// snapshot save` leaves its files, so that `etcdutl snapshot restore`
// accepts the file without --skip-hash-check. path must hold a bbolt file
// without a trailer (as Write leaves it).
func AppendTrailer(path string) error {
	if err := appendTrailer(path); err != nil {
		return fmt.Errorf("snapshot: append trailer to %s: %w", path, err)
	}
	return nil
}

func appendTrailer(path string) (err error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size()%sizeAlign != 0 {
		return fmt.Errorf("size %d is not a whole number of bbolt pages", fi.Size())
	}
	sum, err := sha256Prefix(f, fi.Size())
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(sum, fi.Size()); err != nil {
		return err
	}
	return f.Sync()
}
