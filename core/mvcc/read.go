package mvcc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/tso"
)

// entry is one key's version as seen by a read.
type entry struct {
	key   []byte
	hdr   header
	value []byte
	// loaded is true when value holds the version's value.
	loaded bool
}

func (e *entry) keyValue(withValue bool) *mvccpb.KeyValue {
	kvp := &mvccpb.KeyValue{
		Key:            e.key,
		CreateRevision: e.hdr.createRev,
		ModRevision:    e.hdr.modRev,
		Version:        e.hdr.version,
		Lease:          e.hdr.lease,
	}
	if withValue {
		kvp.Value = e.value
	}
	return kvp
}

// Range serves an etcd Range at req.Revision (0 = current).
func (b *Backend) Range(ctx context.Context, req *pb.RangeRequest) (*pb.RangeResponse, error) {
	if b.closed.Load() {
		return nil, ErrClosed
	}
	cur, _, err := b.readRevisions(ctx)
	if err != nil {
		return nil, err
	}
	rev := req.Revision
	if rev > cur {
		return nil, ErrFutureRev
	}
	if rev <= 0 {
		rev = cur
	}
	unpin, err := b.pin(rev)
	if err != nil {
		return nil, err
	}
	defer unpin()
	entries, err := b.entriesAt(ctx, req.Key, req.RangeEnd, rev)
	if err != nil {
		return nil, err
	}
	resp, err := buildRange(ctx, req, entries, b.valueLoader(ctx))
	if err != nil {
		return nil, err
	}
	resp.Header = &pb.ResponseHeader{Revision: cur}
	return resp, nil
}

// entriesAt returns the live versions at rev of the keys in [key, end), in key
// order, with values not yet loaded.
func (b *Backend) entriesAt(ctx context.Context, key, end []byte, rev int64) ([]entry, error) {
	if len(end) == 0 {
		raw, err := b.store.Get(ctx, coder.RevisionKey(key))
		if errors.Is(err, kv.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, storageErr("get", err)
		}
		h, _, err := decodeHeader(raw)
		if err != nil {
			return nil, err
		}
		e, ok, err := b.resolveAt(ctx, key, h, rev)
		if err != nil || !ok {
			return nil, err
		}
		return []entry{e}, nil
	}
	start, stop := coder.RevisionRange(key, end)
	if bytes.Compare(start, stop) >= 0 {
		return nil, nil
	}
	var out []entry
	err := scanAll(ctx, b.store, kv.ScanOptions{Start: start, End: stop, BatchSize: 1024}, func(p kv.Pair) error {
		k, err := coder.DecodeRevisionKey(p.Key)
		if err != nil {
			return err
		}
		h, _, err := decodeHeader(p.Value)
		if err != nil {
			return err
		}
		e, ok, err := b.resolveAt(ctx, k, h, rev)
		if err != nil {
			return err
		}
		if ok {
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, storageErr("scan", err)
	}
	return out, nil
}

// resolveAt turns a key's latest header into its live version at rev, looking
// into history when the latest version is newer than rev.
func (b *Backend) resolveAt(ctx context.Context, key []byte, latest header, rev int64) (entry, bool, error) {
	if latest.modRev <= rev {
		if latest.tombstone {
			return entry{}, false, nil
		}
		return entry{key: key, hdr: latest}, true, nil
	}
	return b.versionAt(ctx, key, rev)
}

// versionAt reads the live version of key at rev from history.
func (b *Backend) versionAt(ctx context.Context, key []byte, rev int64) (entry, bool, error) {
	start, stop := coder.ObjectVersions(key, 0, rev)
	it, err := b.store.Scan(ctx, kv.ScanOptions{Start: start, End: stop, Reverse: true, Limit: 1})
	if err != nil {
		return entry{}, false, storageErr("scan history", err)
	}
	defer it.Close()
	batch, err := it.Next(ctx)
	if err != nil {
		return entry{}, false, storageErr("scan history", err)
	}
	if len(batch) == 0 {
		return entry{}, false, nil
	}
	_, r, err := coder.DecodeObjectKey(batch[0].Key)
	if err != nil {
		return entry{}, false, err
	}
	h, val, err := decodeHeader(batch[0].Value)
	if err != nil {
		return entry{}, false, err
	}
	h.modRev = r
	if h.tombstone {
		return entry{}, false, nil
	}
	return entry{key: key, hdr: h, value: val, loaded: true}, true, nil
}

// valueLoader returns a function that loads an entry's value from history.
func (b *Backend) valueLoader(ctx context.Context) func(*entry) error {
	return func(e *entry) error {
		if e.loaded {
			return nil
		}
		raw, err := b.store.Get(ctx, coder.ObjectKey(e.key, e.hdr.modRev))
		if err != nil {
			if errors.Is(err, kv.ErrNotFound) {
				return fmt.Errorf("mvcc: object %q@%d missing from history: %w", e.key, e.hdr.modRev, errBadRecord)
			}
			return storageErr("get object", err)
		}
		_, val, err := decodeHeader(raw)
		if err != nil {
			return err
		}
		e.value, e.loaded = val, true
		return nil
	}
}

// buildRange applies etcd's Range options to the live entries of a range.
// Count is the number of live keys in the range, whatever the limit and
// filters; More reports that the limit cut the result.
func buildRange(ctx context.Context, req *pb.RangeRequest, entries []entry, load func(*entry) error) (*pb.RangeResponse, error) {
	resp := &pb.RangeResponse{Count: int64(len(entries))}
	if req.CountOnly {
		return resp, nil
	}
	kept := entries
	if req.MinModRevision != 0 || req.MaxModRevision != 0 || req.MinCreateRevision != 0 || req.MaxCreateRevision != 0 {
		kept = make([]entry, 0, len(entries))
		for _, e := range entries {
			if req.MinModRevision != 0 && e.hdr.modRev < req.MinModRevision ||
				req.MaxModRevision != 0 && e.hdr.modRev > req.MaxModRevision ||
				req.MinCreateRevision != 0 && e.hdr.createRev < req.MinCreateRevision ||
				req.MaxCreateRevision != 0 && e.hdr.createRev > req.MaxCreateRevision {
				continue
			}
			kept = append(kept, e)
		}
	}
	order := req.SortOrder
	if order == pb.RangeRequest_NONE && req.SortTarget != pb.RangeRequest_KEY {
		// etcd: a sort target without an order sorts ascending.
		order = pb.RangeRequest_ASCEND
	}
	sortByValue := req.SortTarget == pb.RangeRequest_VALUE && order != pb.RangeRequest_NONE
	if sortByValue {
		for i := range kept {
			if err := load(&kept[i]); err != nil {
				return nil, err
			}
		}
	}
	if order != pb.RangeRequest_NONE && !(order == pb.RangeRequest_ASCEND && req.SortTarget == pb.RangeRequest_KEY) {
		less := sortLess(req.SortTarget, kept)
		if order == pb.RangeRequest_DESCEND {
			sort.SliceStable(kept, func(i, j int) bool { return less(j, i) })
		} else {
			sort.SliceStable(kept, less)
		}
	}
	if req.Limit > 0 && int64(len(kept)) > req.Limit {
		kept = kept[:req.Limit]
		resp.More = true
	}
	resp.Kvs = make([]*mvccpb.KeyValue, len(kept))
	for i := range kept {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !req.KeysOnly {
			if err := load(&kept[i]); err != nil {
				return nil, err
			}
		}
		resp.Kvs[i] = kept[i].keyValue(!req.KeysOnly)
	}
	return resp, nil
}

func sortLess(target pb.RangeRequest_SortTarget, es []entry) func(i, j int) bool {
	switch target {
	case pb.RangeRequest_VERSION:
		return func(i, j int) bool { return es[i].hdr.version < es[j].hdr.version }
	case pb.RangeRequest_CREATE:
		return func(i, j int) bool { return es[i].hdr.createRev < es[j].hdr.createRev }
	case pb.RangeRequest_MOD:
		return func(i, j int) bool { return es[i].hdr.modRev < es[j].hdr.modRev }
	case pb.RangeRequest_VALUE:
		return func(i, j int) bool { return bytes.Compare(es[i].value, es[j].value) < 0 }
	default:
		return func(i, j int) bool { return bytes.Compare(es[i].key, es[j].key) < 0 }
	}
}

func storageErr(op string, err error) error {
	if errors.Is(err, kv.ErrClosed) {
		return ErrClosed
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

// Events returns the committed events with revisions in [from, to], in
// revision order, stopping after the revision that brings the count to at
// least max. next is the first revision not returned. prev_kv is filled for
// every event whose key existed before.
func (b *Backend) Events(ctx context.Context, from, to int64, limit int) (events []*mvccpb.Event, next int64, err error) {
	// An empty store's revision has no change; the first record is at the
	// revision after it.
	from = max(from, tso.FirstRevision+1)
	if from > to {
		return nil, from, nil
	}
	unpin, err := b.pin(from)
	if err != nil {
		return nil, from, err
	}
	defer unpin()
	it, err := b.store.Scan(ctx, kv.ScanOptions{Start: coder.EventKey(from), End: coder.EventKey(to + 1), BatchSize: 256})
	if err != nil {
		return nil, from, storageErr("scan change log", err)
	}
	defer it.Close()
	next = from
	for {
		batch, err := it.Next(ctx)
		if err != nil {
			return nil, from, storageErr("scan change log", err)
		}
		if len(batch) == 0 {
			return events, to + 1, nil
		}
		for _, p := range batch {
			rev, err := coder.DecodeEventKey(p.Key)
			if err != nil {
				return nil, from, err
			}
			if rev != next {
				return nil, from, fmt.Errorf("mvcc: change log jumps from revision %d to %d: %w", next, rev, errBadRecord)
			}
			changes, err := decodeChanges(p.Value)
			if err != nil {
				return nil, from, err
			}
			for _, c := range changes {
				ev, err := b.materialize(ctx, rev, c)
				if err != nil {
					return nil, from, err
				}
				events = append(events, ev)
			}
			next = rev + 1
			if len(events) >= limit {
				return events, next, nil
			}
		}
	}
}

// materialize builds the watch event of one change-log entry from history.
func (b *Backend) materialize(ctx context.Context, rev int64, c change) (*mvccpb.Event, error) {
	ev := &mvccpb.Event{}
	if c.deleted {
		ev.Type = mvccpb.DELETE
		ev.Kv = &mvccpb.KeyValue{Key: c.key, ModRevision: rev}
	} else {
		raw, err := b.store.Get(ctx, coder.ObjectKey(c.key, rev))
		if err != nil {
			return nil, storageErr(fmt.Sprintf("get object %q@%d", c.key, rev), err)
		}
		h, val, err := decodeHeader(raw)
		if err != nil {
			return nil, err
		}
		h.modRev = rev
		e := entry{key: c.key, hdr: h, value: val, loaded: true}
		ev.Type = mvccpb.PUT
		ev.Kv = e.keyValue(true)
	}
	if c.prevRev > 0 {
		pe := entry{key: c.key, hdr: header{modRev: c.prevRev}}
		raw, err := b.store.Get(ctx, coder.ObjectKey(c.key, c.prevRev))
		switch {
		case errors.Is(err, kv.ErrNotFound):
			// Compacted away: etcd leaves prev_kv unset in this case too.
		case err != nil:
			return nil, storageErr("get previous object", err)
		default:
			h, val, err := decodeHeader(raw)
			if err != nil {
				return nil, err
			}
			h.modRev = c.prevRev
			pe.hdr, pe.value, pe.loaded = h, val, true
			ev.PrevKv = pe.keyValue(true)
		}
	}
	return ev, nil
}
