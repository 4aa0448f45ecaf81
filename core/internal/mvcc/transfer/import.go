package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/tso"
	"github.com/engramkv/engram/core/kv"
)

// The import path writes versions whose revisions were chosen elsewhere (an
// etcd snapshot, a live etcd being migrated) in exactly the layout the
// writer would have produced had it made those writes itself: latest
// records, history, the change log, lease records and the lease index. Only
// migration uses it (a restore into an empty store takes the bulk import,
// importbulk.go, which writes the same records); every ordinary write goes
// through the writer.
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

// ErrNotEmpty is returned by NewImporter and BulkImport for a store that
// holds data.
var ErrNotEmpty = errors.New("mvcc: the store is not empty")

// ImportOptions configure an Importer.
type ImportOptions struct {
	Store  kv.Store
	Logger *slog.Logger
	// Record is written as the import record; Applied is maintained by the
	// importer.
	Record mvcc.ImportRecord
	// Resume continues the unfinished import the store holds if it is of
	// the same Kind and Source (ResumeFrom then returns its record);
	// without Resume, or for a different import, a store holding an
	// unfinished import of the same Kind is wiped first and any other
	// non-empty store is refused with ErrNotEmpty.
	Resume bool
	// MaxBatchBytes bounds a batch (a larger single revision still goes in
	// one batch); 0 means 2 MiB.
	MaxBatchBytes int
	// CountVersions accepts live rows with version 0, from a source that
	// does not count versions (kine reports 0 for every key): such a row
	// gets the key's imported version plus one, 1 for a create, as etcd
	// would have counted from the first version imported. Without it a
	// version 0 is refused, as etcd never reports one for a live key.
	CountVersions bool
}

// Importer writes imported versions into a store. It is not safe for
// concurrent use, and nothing else may write to the store meanwhile.
type Importer struct {
	store   kv.Store
	log     *slog.Logger
	record  mvcc.ImportRecord
	resumed bool

	maxBytes      int
	countVersions bool
	// batch state: ops, and where each key's op is (a batch never names a
	// key twice, so a later op on a key replaces the earlier one)
	ops     []kv.Op
	opIndex map[string]int
	size    int
	keys    map[string]*importKey
	changes []mvcc.Change // of revision cur
	cur     int64         // revision of the rows being added (0 before the first)
	curSub  int64
	open    bool // rows of cur were added and cur is not complete yet
	// logNext is the next revision that needs a change-log record.
	logNext int64
	// leases holds the imported leases' IDs, to write the lease index only
	// for keys attached to a lease that exists.
	leases map[int64]bool
}

type importKey struct {
	cur    mvcc.Version
	value  []byte
	exists bool
	leaseW bool // lease index entry present for cur.lease
	// stagedRev is the revision of the key's last imported row; before is
	// the revision of its live version before stagedRev (0: none), and
	// change the index of its last change in the revision's change-log
	// record (-1: not logged).
	stagedRev, before int64
	change            int
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
	im := &Importer{store: opts.Store, log: opts.Logger, record: opts.Record, maxBytes: opts.MaxBatchBytes, countVersions: opts.CountVersions, keys: map[string]*importKey{}, opIndex: map[string]int{}, leases: map[int64]bool{}}
	im.record.Applied = 0
	prev, err := mvcc.ReadImportRecord(ctx, opts.Store)
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
func (im *Importer) Record() mvcc.ImportRecord { return im.record }

// importSpaces are the spaces an import writes; a store with a key in any
// of them is not empty.
var importSpaces = []coder.Space{coder.SpaceRevision, coder.SpaceObject, coder.SpaceEvent, coder.SpaceLease, coder.SpaceLeaseKeys, coder.SpaceMeta}

// CheckEmpty returns ErrNotEmpty, naming what the store holds, unless the
// store holds nothing an import writes. A migration calls it before it
// downloads anything, so a wrong target is refused at once rather than
// after a base copy of the whole source.
func CheckEmpty(ctx context.Context, s kv.Store) error {
	prev, err := mvcc.ReadImportRecord(ctx, s)
	if err != nil {
		return err
	}
	if prev != nil {
		return fmt.Errorf("%w: it holds an unfinished %s from %s (applied up to revision %d)", ErrNotEmpty, prev.Kind, prev.Source, prev.Applied)
	}
	return checkEmpty(ctx, s)
}

func checkEmpty(ctx context.Context, s kv.Store) error {
	for _, sp := range importSpaces {
		var found []byte
		err := kv.ScanEach(ctx, s, kv.ScanOptions{Start: coder.Prefix(sp), End: coder.SpaceEnd(sp), Limit: 1}, func(p kv.Pair) error {
			found = p.Key
			return nil
		})
		if err != nil {
			return mvcc.StorageError("check the store is empty", err)
		}
		if found != nil {
			rev, err := tso.Recover(ctx, s)
			if err != nil {
				return err
			}
			return fmt.Errorf("%w: it holds data up to revision %d (%s); restore or migrate only into an empty store", ErrNotEmpty, rev, describeFound(ctx, s))
		}
	}
	return nil
}

// describeFound names what a non-empty store holds, for the error that
// refuses it: a key and how many there are (counted up to a bound: the
// store may be large), or else the kind of record found.
func describeFound(ctx context.Context, s kv.Store) string {
	const bound = 1000
	var (
		first []byte
		n     int
	)
	err := kv.ScanEach(ctx, s, kv.ScanOptions{Start: coder.Prefix(coder.SpaceRevision), End: coder.SpaceEnd(coder.SpaceRevision), Limit: bound}, func(p kv.Pair) error {
		if first == nil {
			first, _ = coder.DecodeRevisionKey(p.Key)
		}
		n++
		return nil
	})
	switch {
	case err != nil || n == 0:
		return "no keys, but lease, history or metadata records"
	case n == 1:
		return fmt.Sprintf("key %q", first)
	case n == bound:
		return fmt.Sprintf("%d or more keys, the first %q", bound, first)
	default:
		return fmt.Sprintf("%d keys, the first %q", n, first)
	}
}

// wipe deletes everything an import writes, in bounded batches.
func wipe(ctx context.Context, s kv.Store) error {
	for _, sp := range importSpaces {
		for {
			var ops []kv.Op
			err := kv.ScanEach(ctx, s, kv.ScanOptions{Start: coder.Prefix(sp), End: coder.SpaceEnd(sp), Limit: 1024}, func(p kv.Pair) error {
				if sp == coder.SpaceMeta && bytes.Equal(p.Key, mvcc.ImportRecordKey()) {
					return nil // removed last: it says the wipe is unfinished
				}
				ops = append(ops, kv.Delete(p.Key))
				return nil
			})
			if err != nil {
				return mvcc.StorageError("wipe unfinished import", err)
			}
			if len(ops) == 0 {
				break
			}
			if err := s.Commit(ctx, ops); err != nil {
				return mvcc.StorageError("wipe unfinished import", err)
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
	return kv.ScanEach(ctx, im.store, kv.ScanOptions{Start: coder.Prefix(coder.SpaceLease), End: coder.SpaceEnd(coder.SpaceLease)}, func(p kv.Pair) error {
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
		p := mvcc.CompactRecord(opts.CompactRev, im.record.CompactRev)
		im.add(kv.Put(p.Key, p.Value))
	}
	im.add(mvcc.ClearImportRecordOp())
	if err := im.store.Commit(ctx, im.ops); err != nil {
		return mvcc.StorageError("finish import", err)
	}
	im.ops = nil
	return nil
}

// dropDanglingLeaseIndex removes lease index entries of leases that were
// dropped after their keys were imported.
func (im *Importer) dropDanglingLeaseIndex(ctx context.Context) error {
	var ops []kv.Op
	err := kv.ScanEach(ctx, im.store, kv.ScanOptions{Start: coder.Prefix(coder.SpaceLeaseKeys), End: coder.SpaceEnd(coder.SpaceLeaseKeys)}, func(p kv.Pair) error {
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
		return mvcc.StorageError("scan lease index", err)
	}
	for len(ops) > 0 {
		n := min(len(ops), 1024)
		if err := im.store.Commit(ctx, ops[:n]); err != nil {
			return mvcc.StorageError("drop lease index", err)
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
