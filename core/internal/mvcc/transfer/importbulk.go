package transfer

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/tso"
	"github.com/engramkv/engram/core/kv"
)

// The bulk import writes a whole history into an empty store in one
// kv.Load: the records the Importer would commit revision by revision,
// without reading the store back and without the engine's write path. The
// rows are sorted by key first (etcdfmt's external sort, bounded memory),
// which lets keyLayout derive each key's records from its own versions. One
// pass over the sorted rows loads the latest records ('k') and the history
// ('o') as they come and sorts the change log ('e') and the lease index
// ('a') apart, in two more external sorts; those, the leases ('l') and the
// meta records ('m') follow. Each space is its own stream of the load
// (kv.Load.AddTo), in key order within it (coder's layout), so no space
// waits for another.
//
// The import record is the load's marker: a store whose load stopped holds
// it, so Open refuses the store and the next import replaces it.

// The load's streams, one per space (kv.Load.AddTo): each is written in
// key order as it is produced, the latest records and the history during
// the pass over the rows.
const (
	streamLeaseIndex = iota
	streamChangeLog
	streamLatest
	streamLeases
	streamMeta
	streamHistory
)

// ImportLease is a lease to import with its granted TTL.
type ImportLease struct {
	ID, TTL int64
}

// BulkImportOptions describe a bulk import.
type BulkImportOptions struct {
	Store  kv.Store
	Loader kv.BulkLoader
	Logger *slog.Logger
	// Record is the import record, the load's marker.
	Record mvcc.ImportRecord
	Leases []ImportLease
	// Rows yields the versions in revision order. It is called once,
	// before anything is loaded.
	Rows func(yield func(*etcdfmt.Entry) error) error
	// Meta are more meta-space records to load with the data (the auth
	// state), so that they are in place when it becomes servable.
	Meta []kv.Pair
	// Finish says where the store resumes, as for Importer.Finish.
	Finish FinishOptions
	// TempDir holds the sorts' spill files ("": the system's); SortMemory
	// bounds each sort's memory (0: 64 MiB).
	TempDir    string
	SortMemory int
	// Progress, if set, is called now and then with the rows read.
	Progress func(rows int64)
}

// BulkImport writes opts.Rows into an empty store (or one holding an
// unfinished import of the same kind, which it replaces) and returns the
// number of rows.
func BulkImport(ctx context.Context, opts BulkImportOptions) (int64, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := checkBulkTarget(ctx, opts.Store, opts.Record.Kind, opts.Logger); err != nil {
		return 0, err
	}
	leases := make(map[int64]bool, len(opts.Leases))
	for _, l := range opts.Leases {
		if l.ID == 0 {
			return 0, fmt.Errorf("mvcc: import: lease ID 0 names no lease")
		}
		if l.TTL <= 0 {
			return 0, fmt.Errorf("mvcc: import: lease %x has TTL %d", l.ID, l.TTL)
		}
		leases[l.ID] = true
	}
	fin := opts.Finish
	if fin.CompactRev < opts.Record.CompactRev || fin.CompactRev > fin.Rev {
		return 0, fmt.Errorf("mvcc: import: compacted revision %d outside [%d, %d]", fin.CompactRev, opts.Record.CompactRev, fin.Rev)
	}

	rows := etcdfmt.NewKeySorter(opts.TempDir, opts.SortMemory)
	defer rows.Close()
	n, last, err := sortRows(ctx, opts, rows)
	if err != nil {
		return 0, err
	}
	if fin.Rev < last {
		return 0, fmt.Errorf("mvcc: import: finishing at revision %d below the last imported revision %d", fin.Rev, last)
	}

	marker, err := mvcc.ImportRecordOp(opts.Record)
	if err != nil {
		return 0, err
	}
	load, err := opts.Loader.BulkLoad(ctx, kv.Pair{Key: marker.Key, Value: marker.Value})
	if err != nil {
		return 0, mvcc.StorageError("start the load", err)
	}
	defer load.Abort()
	out := &loadWriter{ctx: ctx, load: load}

	// One pass over the rows in key order loads the latest records and
	// the history as they come, each space its own stream, and sorts the
	// change log and the lease index apart; those follow.
	firstLogged := max(opts.Record.CompactRev, tso.FirstRevision+1)
	changes := etcdfmt.NewSorter(opts.TempDir, opts.SortMemory)
	defer changes.Close()
	index := etcdfmt.NewKeySorter(opts.TempDir, opts.SortMemory)
	defer index.Close()
	var ce etcdfmt.Entry
	var historyKey []byte
	layout := &keyLayout{firstLogged: firstLogged, leases: leases,
		latest: func(key, record []byte) error {
			out.key = coder.AppendRevisionKey(out.key[:0], key)
			return out.put(streamLatest, out.key, record)
		},
		history: func(key []byte, rev int64, record []byte) error {
			historyKey = coder.AppendObjectKey(historyKey[:0], key, rev)
			return out.put(streamHistory, historyKey, record)
		},
		change: func(main, sub int64, c *mvcc.Change) error {
			// A change travels through the sort as an Entry: its
			// revision, key and deletion as such, prevRev as
			// CreateRevision and the superseded record as Value.
			ce = etcdfmt.Entry{Rev: etcdfmt.Revision{Main: main, Sub: sub}, Tombstone: c.Deleted,
				KV: etcdfmt.KeyValue{Key: c.Key, CreateRevision: c.PrevRev, Value: c.Superseded}}
			return changes.Add(&ce)
		},
		leaseIndex: func(lease int64, key []byte) error {
			ce = etcdfmt.Entry{KV: etcdfmt.KeyValue{Key: coder.LeaseIndexKey(lease, key)}}
			return index.Add(&ce)
		},
	}
	err = layout.run(ctx, rows)
	// Each sort's memory and run file go as soon as it is loaded, before
	// the next stream's tables are built.
	if err == nil {
		err = rows.Close()
	}
	if err == nil {
		err = index.Each(ctx, func(e *etcdfmt.Entry) error { return out.put(streamLeaseIndex, e.KV.Key, nil) })
	}
	if err == nil {
		err = index.Close()
	}
	if err == nil {
		err = loadChangeLog(ctx, out, changes, firstLogged, fin.Rev)
	}
	if err == nil {
		err = changes.Close()
	}
	if err == nil {
		err = loadSorted(out, streamLeases, leasePairs(opts.Leases))
	}
	if err == nil {
		var meta []kv.Pair
		meta, err = metaPairs(opts, fin)
		if err == nil {
			err = loadSorted(out, streamMeta, meta)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("mvcc: import: %w", err)
	}
	if err := load.Finish(ctx); err != nil {
		return 0, mvcc.StorageError("finish the load", err)
	}
	return n, nil
}

// checkBulkTarget refuses a store that holds data or another kind's
// unfinished import, as NewImporter does; one holding an unfinished import
// of kind is the loader's to replace.
func checkBulkTarget(ctx context.Context, s kv.Store, kind string, log *slog.Logger) error {
	prev, err := mvcc.ReadImportRecord(ctx, s)
	switch {
	case err != nil:
		return err
	case prev == nil:
		return checkEmpty(ctx, s)
	case prev.Kind != kind:
		return fmt.Errorf("%w: an unfinished %s from %s (applied up to revision %d); finish it or wipe the store first", ErrNotEmpty, prev.Kind, prev.Source, prev.Applied)
	}
	log.Warn("replacing the store's unfinished import", "kind", prev.Kind, "source", prev.Source)
	return nil
}

// sortRows checks the rows as Add does and sorts them by key; it returns
// their number and the last main revision.
func sortRows(ctx context.Context, opts BulkImportOptions, sorted *etcdfmt.Sorter) (n, last int64, err error) {
	var prev etcdfmt.Revision
	err = opts.Rows(func(e *etcdfmt.Entry) error {
		r := e.Rev
		if n > 0 && !prev.Less(r) {
			return fmt.Errorf("mvcc: import: revision %d/%d out of order (after %d/%d)", r.Main, r.Sub, prev.Main, prev.Sub)
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
		if err := sorted.Add(e); err != nil {
			return err
		}
		prev, last = r, r.Main
		if n++; opts.Progress != nil && n%10000 == 0 {
			opts.Progress(n)
		}
		if n%1024 == 0 {
			return ctx.Err()
		}
		return nil
	})
	return n, last, err
}

// loadChangeLog loads a change-log record for every revision from
// firstLogged to rev: the sorted changes of the revisions that have any,
// an empty one for the others.
func loadChangeLog(ctx context.Context, out *loadWriter, changes *etcdfmt.Sorter, firstLogged, rev int64) error {
	next := firstLogged // the next revision without a record
	var (
		cur   int64
		group []mvcc.Change
		arena []byte
	)
	emit := func(upTo int64) error {
		for ; next < upTo; next++ {
			var cs []mvcc.Change
			if next == cur {
				cs = group
			}
			out.key = coder.AppendEventKey(out.key[:0], next)
			out.value = mvcc.AppendChanges(out.value[:0], cs)
			if err := out.put(streamChangeLog, out.key, out.value); err != nil {
				return err
			}
		}
		return nil
	}
	err := changes.Each(ctx, func(e *etcdfmt.Entry) error {
		if e.Rev.Main != cur {
			if err := emit(e.Rev.Main); err != nil {
				return err
			}
			cur, group, arena = e.Rev.Main, group[:0], arena[:0]
		}
		// The entry's slices are reused: keep copies until the
		// revision's record is written.
		start := len(arena)
		arena = append(arena, e.KV.Key...)
		arena = append(arena, e.KV.Value...)
		group = append(group, mvcc.Change{Deleted: e.Tombstone, PrevRev: e.KV.CreateRevision})
		c := &group[len(group)-1]
		c.Key = arena[start : start+len(e.KV.Key) : start+len(e.KV.Key)]
		if len(e.KV.Value) > 0 {
			c.Superseded = arena[start+len(e.KV.Key) : len(arena) : len(arena)]
		}
		return nil
	})
	if err != nil {
		return err
	}
	return emit(rev + 1)
}

func leasePairs(leases []ImportLease) []kv.Pair {
	ps := make([]kv.Pair, 0, len(leases))
	for _, l := range leases {
		ps = append(ps, kv.Pair{Key: coder.LeaseKey(l.ID), Value: mvcc.LeaseRecord(l.TTL)})
	}
	return ps
}

// metaPairs are the meta records the import writes besides the marker.
func metaPairs(opts BulkImportOptions, fin FinishOptions) ([]kv.Pair, error) {
	ps := slices.Clone(opts.Meta)
	if fin.CompactRev > 0 {
		ps = append(ps, mvcc.CompactRecord(fin.CompactRev, opts.Record.CompactRev))
	}
	for _, p := range ps {
		if !bytes.HasPrefix(p.Key, coder.Prefix(coder.SpaceMeta)) || bytes.Equal(p.Key, mvcc.ImportRecordKey()) {
			return nil, fmt.Errorf("key %q is not a meta record the import may write", p.Key)
		}
	}
	return ps, nil
}

// loadSorted loads pairs into stream after sorting them; they are few.
func loadSorted(out *loadWriter, stream int, ps []kv.Pair) error {
	slices.SortFunc(ps, func(a, b kv.Pair) int { return bytes.Compare(a.Key, b.Key) })
	for _, p := range ps {
		if err := out.put(stream, p.Key, p.Value); err != nil {
			return err
		}
	}
	return nil
}

// loadWriter hands pairs to a load one at a time; key and value are
// scratch buffers its callers may build pairs in.
type loadWriter struct {
	ctx        context.Context
	load       kv.Load
	one        [1]kv.Pair
	key, value []byte
}

func (w *loadWriter) put(stream int, key, value []byte) error {
	w.one[0] = kv.Pair{Key: key, Value: value}
	if err := w.load.AddTo(w.ctx, stream, w.one[:]); err != nil {
		return mvcc.StorageError("load", err)
	}
	return nil
}
