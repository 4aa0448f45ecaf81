package mvcc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/tso"
	"github.com/engramkv/engram/core/kv"
)

// The import path writes versions whose revisions were chosen elsewhere (an
// etcd snapshot, a live etcd being migrated) in exactly the layout the
// writer would have produced had it made those writes itself: latest
// records, history, the change log, lease records and the lease index. Only
// restore and migration use it; every ordinary write goes through the
// writer.
//
// It accepts what the writer never produces: gaps between revisions and
// sparse history at or below the compacted revision (an etcd backend after
// compaction keeps only each live key's latest version there). The change
// log, which watches and the revision clock read, is kept dense from the
// compacted revision up by empty records for revisions that changed nothing
// here (revisions of other keys, when only a prefix is imported).
//
// Nothing half-imported is ever served: the importer writes an import
// record (meta "import") before anything else and removes it in the batch
// that completes the import, and Open refuses a store that holds one.
// Batches end only at revision boundaries and carry the import record with
// the last revision they complete, so an interrupted migration resumes from
// a whole revision.

const metaImport = "import"

// ErrImportUnfinished is returned by Open for a store whose import (restore
// or migration) did not complete.
var ErrImportUnfinished = errors.New("mvcc: the store holds an unfinished import")

// ErrNotEmpty is returned by NewImporter for a store that holds data.
var ErrNotEmpty = errors.New("mvcc: the store is not empty")

// ImportRecord is the durable state of an import, kept in meta "import"
// while it runs.
type ImportRecord struct {
	// Kind is "restore" or "migrate"; Source names what is imported (a file,
	// an endpoint).
	Kind   string `json:"kind"`
	Source string `json:"source"`
	// CompactRev is the compacted revision of the imported history.
	CompactRev int64 `json:"compact_rev"`
	// Applied is the last revision whose rows were all committed, 0 before
	// the first batch.
	Applied int64 `json:"applied"`
	// Extra is the caller's own resume state (a migration's source and
	// phase), stored and returned as is.
	Extra json.RawMessage `json:"extra,omitempty"`
}

// ImportOptions configure an Importer.
type ImportOptions struct {
	Store  kv.Store
	Logger *slog.Logger
	// Record is written as the import record; Applied is maintained by the
	// importer.
	Record ImportRecord
	// Resume continues the unfinished import the store holds if it is of
	// the same Kind and Source (ResumeFrom then returns its record);
	// without Resume, or for a different import, a store holding an
	// unfinished import of the same Kind is wiped first and any other
	// non-empty store is refused with ErrNotEmpty.
	Resume bool
	// MaxBatchBytes bounds a batch (a larger single revision still goes in
	// one batch); 0 means 2 MiB.
	MaxBatchBytes int
}

// Importer writes imported versions into a store. It is not safe for
// concurrent use, and nothing else may write to the store meanwhile.
type Importer struct {
	store   kv.Store
	log     *slog.Logger
	record  ImportRecord
	resumed bool

	maxBytes int
	// batch state: ops, and where each key's op is (a batch never names a
	// key twice, so a later op on a key replaces the earlier one)
	ops     []kv.Op
	opIndex map[string]int
	size    int
	keys    map[string]*importKey
	changes []change // of revision cur
	cur     int64    // revision of the rows being added (0 before the first)
	curSub  int64
	open    bool // rows of cur were added and cur is not complete yet
	// logNext is the next revision that needs a change-log record.
	logNext int64
	// leases holds the imported leases' IDs, to write the lease index only
	// for keys attached to a lease that exists.
	leases map[int64]bool
}

type importKey struct {
	cur    header
	value  []byte
	exists bool
	leaseW bool // lease index entry present for cur.lease
}

// NewImporter prepares store for an import. See ImportOptions.Resume for
// what it does with a store that is not empty.
func NewImporter(ctx context.Context, opts ImportOptions) (*Importer, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxBatchBytes <= 0 {
		opts.MaxBatchBytes = 2 << 20
	}
	im := &Importer{store: opts.Store, log: opts.Logger, record: opts.Record, maxBytes: opts.MaxBatchBytes, keys: map[string]*importKey{}, opIndex: map[string]int{}, leases: map[int64]bool{}}
	im.record.Applied = 0
	prev, err := ReadImportRecord(ctx, opts.Store)
	switch {
	case err != nil:
		return nil, err
	case prev != nil && opts.Resume && prev.Kind == opts.Record.Kind && prev.Source == opts.Record.Source:
		im.record = *prev
		im.resumed = true
		if err := im.loadResumeState(ctx); err != nil {
			return nil, err
		}
		im.log.Info("resuming unfinished import", "kind", prev.Kind, "source", prev.Source, "applied", prev.Applied)
		return im, nil
	case prev != nil && prev.Kind == opts.Record.Kind:
		im.log.Warn("wiping the store's unfinished import before starting again", "kind", prev.Kind, "source", prev.Source, "applied", prev.Applied)
		if err := wipe(ctx, opts.Store); err != nil {
			return nil, err
		}
	case prev != nil:
		return nil, fmt.Errorf("%w: an unfinished %s from %s (applied up to revision %d); finish it or wipe the store first", ErrNotEmpty, prev.Kind, prev.Source, prev.Applied)
	default:
		if err := checkEmpty(ctx, opts.Store); err != nil {
			return nil, err
		}
	}
	if err := im.putRecord(ctx); err != nil {
		return nil, err
	}
	return im, nil
}

// Resumed reports whether the importer continues an earlier import, whose
// record Record returns.
func (im *Importer) Resumed() bool { return im.resumed }

// Record returns the import record as last committed.
func (im *Importer) Record() ImportRecord { return im.record }

// ReadImportRecord returns the store's unfinished import record, or nil.
func ReadImportRecord(ctx context.Context, s kv.Store) (*ImportRecord, error) {
	raw, err := s.Get(ctx, coder.MetaKey(metaImport))
	if errors.Is(err, kv.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, storageErr("read import record", err)
	}
	var r ImportRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%w: import record: %v", errBadRecord, err)
	}
	return &r, nil
}

func (im *Importer) putRecord(ctx context.Context) error {
	raw, err := json.Marshal(im.record)
	if err != nil {
		return err
	}
	if err := im.store.Commit(ctx, []kv.Op{kv.Put(coder.MetaKey(metaImport), raw)}); err != nil {
		return storageErr("write import record", err)
	}
	return nil
}

// importSpaces are the spaces an import writes; a store with a key in any
// of them is not empty.
var importSpaces = []coder.Space{coder.SpaceRevision, coder.SpaceObject, coder.SpaceEvent, coder.SpaceLease, coder.SpaceLeaseKeys, coder.SpaceMeta}

func checkEmpty(ctx context.Context, s kv.Store) error {
	for _, sp := range importSpaces {
		var found []byte
		err := scanAll(ctx, s, kv.ScanOptions{Start: coder.Prefix(sp), End: coder.SpaceEnd(sp), Limit: 1}, func(p kv.Pair) error {
			found = p.Key
			return nil
		})
		if err != nil {
			return storageErr("check the store is empty", err)
		}
		if found != nil {
			rev, err := tso.Recover(ctx, s)
			if err != nil {
				return err
			}
			return fmt.Errorf("%w: it holds data up to revision %d; restore or migrate only into an empty store", ErrNotEmpty, rev)
		}
	}
	return nil
}

// wipe deletes everything an import writes, in bounded batches.
func wipe(ctx context.Context, s kv.Store) error {
	for _, sp := range importSpaces {
		for {
			var ops []kv.Op
			err := scanAll(ctx, s, kv.ScanOptions{Start: coder.Prefix(sp), End: coder.SpaceEnd(sp), Limit: 1024}, func(p kv.Pair) error {
				if sp == coder.SpaceMeta && bytes.Equal(p.Key, coder.MetaKey(metaImport)) {
					return nil // removed last: it says the wipe is unfinished
				}
				ops = append(ops, kv.Delete(p.Key))
				return nil
			})
			if err != nil {
				return storageErr("wipe unfinished import", err)
			}
			if len(ops) == 0 {
				break
			}
			if err := s.Commit(ctx, ops); err != nil {
				return storageErr("wipe unfinished import", err)
			}
		}
	}
	return nil
}

// loadResumeState restores what a resumed import needs beyond the store's
// records: the revision position and the lease set.
func (im *Importer) loadResumeState(ctx context.Context) error {
	im.cur = im.record.Applied
	last, err := tso.Recover(ctx, im.store)
	if err != nil {
		return err
	}
	im.logNext = max(last+1, im.firstLogged())
	return scanAll(ctx, im.store, kv.ScanOptions{Start: coder.Prefix(coder.SpaceLease), End: coder.SpaceEnd(coder.SpaceLease)}, func(p kv.Pair) error {
		id, err := coder.DecodeLeaseKey(p.Key)
		if err != nil {
			return err
		}
		im.leases[id] = true
		return nil
	})
}

// firstLogged is the first revision the change log holds: the compacted
// revision (a watch may start there), and never revision 1, the empty
// store's, which has no changes.
func (im *Importer) firstLogged() int64 {
	return max(im.record.CompactRev, tso.FirstRevision+1)
}

// Lease imports (or updates) a lease with its granted TTL. Import leases
// before the rows attached to them.
func (im *Importer) Lease(id, ttl int64) error {
	if id <= 0 {
		return fmt.Errorf("mvcc: import: lease ID %d is not positive", id)
	}
	if ttl <= 0 {
		return fmt.Errorf("mvcc: import: lease %x has TTL %d", id, ttl)
	}
	im.leases[id] = true
	im.add(kv.Put(coder.LeaseKey(id), encodeLease(ttl)))
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
	if !e.Tombstone && (e.KV.CreateRevision <= 0 || e.KV.CreateRevision > r.Main || e.KV.Version <= 0 || e.KV.ModRevision != r.Main) {
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
	h := header{modRev: r.Main, sub: r.Sub, tombstone: e.Tombstone}
	if !e.Tombstone {
		h.createRev, h.version, h.lease = e.KV.CreateRevision, e.KV.Version, e.KV.Lease
	}
	wasLive := s.exists && !s.cur.tombstone
	if s.exists {
		im.add(kv.Put(coder.ObjectKey(key, s.cur.modRev), encodeObject(s.cur, s.value)))
	}
	value := e.KV.Value
	if e.Tombstone {
		value = nil
	}
	im.add(kv.Put(coder.RevisionKey(key), encodeObject(h, value)))
	if r.Main >= im.firstLogged() {
		c := change{deleted: e.Tombstone, key: append([]byte(nil), key...)}
		if wasLive {
			c.prevRev = s.cur.modRev
		}
		im.changes = append(im.changes, c)
	}
	// The lease index follows the latest live version's lease.
	newLease := int64(0)
	if !e.Tombstone && im.leases[h.lease] {
		newLease = h.lease
	}
	oldLease := int64(0)
	if s.leaseW {
		oldLease = s.cur.lease
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
		return nil, storageErr("read revision key", err)
	default:
		h, val, err := decodeHeader(raw)
		if err != nil {
			return nil, err
		}
		s.cur, s.value, s.exists = h, val, true
		if !h.tombstone && h.lease != 0 {
			_, err := im.store.Get(ctx, coder.LeaseIndexKey(h.lease, key))
			switch {
			case err == nil:
				s.leaseW = true
			case !errors.Is(err, kv.ErrNotFound):
				return nil, storageErr("read lease index", err)
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
		im.add(kv.Put(coder.EventKey(im.cur), encodeChanges(im.changes)))
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
		im.add(kv.Put(coder.EventKey(r), encodeChanges(nil)))
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

// SetExtra replaces the import record's Extra, written with the next flush.
func (im *Importer) SetExtra(extra json.RawMessage) { im.record.Extra = extra }

func (im *Importer) flush(ctx context.Context) error {
	raw, err := json.Marshal(im.record)
	if err != nil {
		return err
	}
	im.add(kv.Put(coder.MetaKey(metaImport), raw))
	if err := im.store.Commit(ctx, im.ops); err != nil {
		return storageErr(fmt.Sprintf("import up to revision %d", im.record.Applied), err)
	}
	im.ops, im.size = im.ops[:0], 0
	clear(im.opIndex)
	clear(im.keys)
	return nil
}

// FinishOptions complete an import.
type FinishOptions struct {
	// Rev is the revision the store resumes at: the source's revision. It
	// may be above the last imported row (a prefix import, a compaction
	// after the last write).
	Rev int64
	// CompactRev is the compacted revision to record; it may be above the
	// imported history's (etcdutl's --mark-compacted), in which case the
	// server compacts the history below it when it opens the store.
	CompactRev int64
}

// Finish writes the last rows, the change log up to opts.Rev, the
// compacted revision, and removes the import record, in one batch: the store
// becomes servable atomically.
func (im *Importer) Finish(ctx context.Context, opts FinishOptions) error {
	if opts.Rev < im.cur {
		return fmt.Errorf("mvcc: import: finishing at revision %d below the last imported revision %d", opts.Rev, im.cur)
	}
	if opts.CompactRev < im.record.CompactRev || opts.CompactRev > opts.Rev {
		return fmt.Errorf("mvcc: import: compacted revision %d outside [%d, %d]", opts.CompactRev, im.record.CompactRev, opts.Rev)
	}
	if err := im.endRevision(ctx); err != nil {
		return err
	}
	// The clock recovers from the last change-log record, so the store
	// resumes at exactly opts.Rev.
	if err := im.fillLog(ctx, opts.Rev); err != nil {
		return err
	}
	if err := im.flush(ctx); err != nil {
		return err
	}
	if err := im.dropDanglingLeaseIndex(ctx); err != nil {
		return err
	}
	if opts.CompactRev > 0 {
		im.add(kv.Put(coder.MetaKey(metaCompact), compactRecord(opts.CompactRev, im.record.CompactRev)))
	}
	im.add(kv.Delete(coder.MetaKey(metaImport)))
	if err := im.store.Commit(ctx, im.ops); err != nil {
		return storageErr("finish import", err)
	}
	im.ops = nil
	return nil
}

// dropDanglingLeaseIndex removes lease index entries of leases that were
// dropped after their keys were imported.
func (im *Importer) dropDanglingLeaseIndex(ctx context.Context) error {
	var ops []kv.Op
	err := scanAll(ctx, im.store, kv.ScanOptions{Start: coder.Prefix(coder.SpaceLeaseKeys), End: coder.SpaceEnd(coder.SpaceLeaseKeys)}, func(p kv.Pair) error {
		id, _, err := coder.DecodeLeaseIndexKey(p.Key)
		if err != nil {
			return err
		}
		if !im.leases[id] {
			ops = append(ops, kv.Delete(p.Key))
		}
		return nil
	})
	if err != nil {
		return storageErr("scan lease index", err)
	}
	for len(ops) > 0 {
		n := min(len(ops), 1024)
		if err := im.store.Commit(ctx, ops[:n]); err != nil {
			return storageErr("drop lease index", err)
		}
		ops = ops[n:]
	}
	return nil
}

// Leases returns the imported leases' IDs, sorted.
func (im *Importer) Leases() []int64 {
	ids := make([]int64, 0, len(im.leases))
	for id := range im.leases {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// checkImportRecord is Open's guard against serving a half-imported store.
func checkImportRecord(ctx context.Context, s kv.Store) error {
	r, err := ReadImportRecord(ctx, s)
	if err != nil {
		return err
	}
	if r != nil {
		return fmt.Errorf("%w: %s from %s stopped after revision %d; run it again to finish (or wipe the store)", ErrImportUnfinished, r.Kind, r.Source, r.Applied)
	}
	return nil
}

// Unfinish puts an import record back on a store whose import finished but
// must not be served after all (a migration whose verification failed, or
// whose source moved on during the cut-over): Open refuses it again, and an
// importer resuming rec continues from rec.Applied.
func Unfinish(ctx context.Context, s kv.Store, rec ImportRecord) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := s.Commit(ctx, []kv.Op{kv.Put(coder.MetaKey(metaImport), raw)}); err != nil {
		return storageErr("write import record", err)
	}
	return nil
}
