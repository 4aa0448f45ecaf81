package mvcc

import (
	"bytes"
	"context"
	"errors"
	"sort"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// entry is one key's version as seen by a read.
type entry struct {
	key   []byte
	hdr   Version
	value []byte
}

func (e *entry) keyValue(withValue bool) *mvccpb.KeyValue {
	kvp := &mvccpb.KeyValue{
		Key:            e.key,
		CreateRevision: e.hdr.CreateRev,
		ModRevision:    e.hdr.ModRev,
		Version:        e.hdr.Version,
		Lease:          e.hdr.Lease,
	}
	if withValue {
		kvp.Value = e.value
	}
	return kvp
}

// Range serves an etcd Range at req.Revision (0 = current). How a read at a
// past revision finds its versions: (DESIGN.md, "Reads at a revision").
func (b *Backend) Range(ctx context.Context, req *pb.RangeRequest) (*pb.RangeResponse, error) {
	// count_only keeps nothing: the range is only counted. Without sorting
	// or filters only the first Limit entries are kept; the rest are only
	// counted. With a sort target but no order, etcd reads one entry past
	// the limit in key order and sorts only those.
	keep := -1
	switch {
	case req.CountOnly:
		keep = 0
	case req.Limit <= 0:
	case plainOrder(req):
		keep = int(req.Limit)
	case limitBeforeSort(req):
		keep = int(req.Limit) + 1
	}
	return b.answerRange(ctx, req, func(rev int64) ([]entry, int, error) {
		return b.entriesAt(ctx, req.Key, req.RangeEnd, rev, keep)
	})
}

// answerRange answers req with the entries read reads at req's revision,
// pinned while it reads, and how many it counted; the header carries the
// current revision.
func (b *Backend) answerRange(ctx context.Context, req *pb.RangeRequest, read func(rev int64) ([]entry, int, error)) (*pb.RangeResponse, error) {
	cur, rev, unpin, err := b.pinRead(ctx, req.Revision)
	if err != nil {
		return nil, err
	}
	defer unpin()
	entries, count, err := read(rev)
	if err != nil {
		return nil, err
	}
	resp := buildRange(req, entries, count)
	resp.Header = &pb.ResponseHeader{Revision: cur}
	return resp, nil
}

// pinRead reads the current revision, resolves a read's revision against
// it (0 or less: the current revision) and pins it; it returns both.
func (b *Backend) pinRead(ctx context.Context, rev int64) (cur, at int64, unpin func(), err error) {
	if b.closed.Load() {
		return 0, 0, nil, ErrClosed
	}
	if cur, _, err = b.readRevisions(ctx); err != nil {
		return 0, 0, nil, err
	}
	if rev > cur {
		return 0, 0, nil, ErrFutureRev
	}
	if rev <= 0 {
		rev = cur
	}
	if unpin, err = b.pin(rev); err != nil {
		return 0, 0, nil, err
	}
	return cur, rev, unpin, nil
}

// plainOrder reports whether a range returns keys in ascending order with no
// filter, so the first Limit keys are the answer.
func plainOrder(req *pb.RangeRequest) bool {
	sorted := req.SortOrder == pb.RangeRequest_NONE && req.SortTarget == pb.RangeRequest_KEY ||
		req.SortOrder == pb.RangeRequest_ASCEND && req.SortTarget == pb.RangeRequest_KEY
	return sorted && !filtered(req)
}

// limitBeforeSort reports whether etcd applies a range's limit in key order
// before sorting: with a sort target but sort order NONE (which sorts
// ascending) and no filter, it reads only Limit+1 keys, sorts those and
// then cuts to Limit, so the answer is not the range's Limit smallest.
func limitBeforeSort(req *pb.RangeRequest) bool {
	return req.SortOrder == pb.RangeRequest_NONE && req.SortTarget != pb.RangeRequest_KEY && !filtered(req)
}

func filtered(req *pb.RangeRequest) bool {
	return req.MinModRevision != 0 || req.MaxModRevision != 0 || req.MinCreateRevision != 0 || req.MaxCreateRevision != 0
}

// entriesAt returns the live versions at rev of the keys in [key, end) in key
// order, at most keep of them (keep < 0: all), and the number of live keys
// in the range. Entries past keep are counted without decoding their keys
// unless they changed after rev.
//
// Which reads it does depends on what the caller keeps: everything (one
// scan), nothing (one count), or a page, whose count either a previous page
// left in the count cache or a second, header-only scan establishes.
func (b *Backend) entriesAt(ctx context.Context, key, end []byte, rev int64, keep int) ([]entry, int, error) {
	if keep < 0 {
		entries, err := b.pageAt(ctx, key, end, rev, -1)
		return entries, len(entries), err
	}
	if len(end) == 0 {
		return b.pointEntryAt(ctx, key, rev, keep)
	}
	start, stop := coder.RevisionRange(key, end)
	if bytes.Compare(start, stop) >= 0 {
		return nil, 0, nil
	}
	r := rangeRead{b: b, start: start, stop: stop, rev: rev}
	switch {
	case keep == 0:
		count, _, err := r.countLive(ctx, kv.ScanOptions{Start: start, End: stop, BatchSize: 4096, ValuePrefix: maxHeaderLen}, false)
		return nil, count, err
	}
	if count, ok := b.counts.count(stop, rev, start); ok {
		return r.pageOfCountedRange(ctx, keep, count)
	}
	return r.pageThenCount(ctx, keep)
}

// pageAt returns the live versions at rev of the keys in [key, end) in key
// order, at most keep of them (keep < 0: all), reading no further and
// counting nothing past them: one scan, or one lookup for a single key.
func (b *Backend) pageAt(ctx context.Context, key, end []byte, rev int64, keep int) ([]entry, error) {
	if len(end) == 0 {
		entries, _, err := b.pointEntryAt(ctx, key, rev, keep)
		return entries, err
	}
	start, stop := coder.RevisionRange(key, end)
	if bytes.Compare(start, stop) >= 0 {
		return nil, nil
	}
	r := rangeRead{b: b, start: start, stop: stop, rev: rev}
	batch := 1024
	if keep > 0 {
		batch = min(keep, batch)
	}
	entries, _, _, err := r.readPage(ctx, keep, batch, false)
	return entries, err
}

// pointEntryAt is entriesAt for the single key key: one lookup of its latest
// record, and one of history if that is newer than rev.
func (b *Backend) pointEntryAt(ctx context.Context, key []byte, rev int64, keep int) ([]entry, int, error) {
	raw, err := b.latestRecord(ctx, key)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, storageErr("get", err)
	}
	h, val, err := decodeHeader(raw)
	if err != nil {
		return nil, 0, err
	}
	e, ok, err := b.resolveAt(ctx, key, h, val, rev)
	if err != nil || !ok {
		return nil, 0, err
	}
	if keep == 0 {
		return nil, 1, nil
	}
	return []entry{e}, 1, nil
}

// rangeRead reads the live versions at rev in [start, stop), a range of
// revision keys.
type rangeRead struct {
	b           *Backend
	start, stop []byte
	rev         int64
}

// pageOfCountedRange reads only the first keep entries: a previous page of
// the same list already established the range's count.
func (r *rangeRead) pageOfCountedRange(ctx context.Context, keep, count int) ([]entry, int, error) {
	// A little slack over the page covers keys deleted at rev.
	page, _, _, err := r.readPage(ctx, keep, keep+16, false)
	if err != nil {
		return nil, 0, err
	}
	return page, count, nil
}

// pageThenCount reads the first keep entries with their values, then counts
// the rest of the range by record headers only, which the engine may hand
// over without the values (kv.ScanOptions.ValuePrefix). When the range is
// larger than the page, it leaves the live keys in the count cache for the
// list's later pages.
func (r *rangeRead) pageThenCount(ctx context.Context, keep int) ([]entry, int, error) {
	page, live, resume, err := r.readPage(ctx, keep, 1024, true)
	if err != nil {
		return nil, 0, err
	}
	count := len(page)
	if resume != nil {
		rest, restLive, err := r.countLive(ctx, kv.ScanOptions{Start: resume, End: r.stop, BatchSize: 4096, ValuePrefix: maxHeaderLen}, true)
		if err != nil {
			return nil, 0, err
		}
		count += rest
		live = append(live, restLive...)
	}
	if count > keep {
		r.b.counts.add(r.stop, r.rev, r.start, live)
	}
	return page, count, nil
}

// readPage returns the live entries at rev from the start of the range, at
// most keep of them (keep < 0: all), scanning batch records at a time. With
// remember it also returns their revision keys, for the count cache. resume
// is the revision key where it stopped because the page was full, nil when
// it reached the end of the range.
func (r *rangeRead) readPage(ctx context.Context, keep, batch int, remember bool) (page []entry, live [][]byte, resume []byte, err error) {
	if keep > 0 {
		page = make([]entry, 0, min(keep, 4096))
	}
	err = kv.ScanEach(ctx, r.b.store, kv.ScanOptions{Start: r.start, End: r.stop, BatchSize: batch}, func(p kv.Pair) error {
		h, val, err := decodeHeader(p.Value)
		if err != nil {
			return err
		}
		if keep >= 0 && len(page) >= keep {
			resume = p.Key
			return errStopScan
		}
		k, err := coder.DecodeRevisionKey(p.Key)
		if err != nil {
			return err
		}
		e, ok, err := r.b.resolveAt(ctx, k, h, val, r.rev)
		if err != nil || !ok {
			return err
		}
		if remember {
			live = append(live, p.Key)
		}
		page = append(page, e)
		return nil
	})
	if err != nil && !errors.Is(err, errStopScan) {
		return nil, nil, nil, storageErr("scan", err)
	}
	return page, live, resume, nil
}

// countLive counts the keys live at rev in the scan opts describes. A key
// whose latest version is at or below rev is decided by its record's header
// alone; only a key changed since rev needs its key decoded and a look into
// history. With remember it also returns the live keys' revision keys.
func (r *rangeRead) countLive(ctx context.Context, opts kv.ScanOptions, remember bool) (count int, live [][]byte, err error) {
	err = kv.ScanEach(ctx, r.b.store, opts, func(p kv.Pair) error {
		h, _, err := decodeHeader(p.Value)
		if err != nil {
			return err
		}
		if h.ModRev > r.rev {
			// Changed since rev: whether it was live then is in history.
			k, err := coder.DecodeRevisionKey(p.Key)
			if err != nil {
				return err
			}
			if _, ok, err := r.b.versionAt(ctx, k, r.rev); err != nil || !ok {
				return err
			}
		} else if h.Tombstone {
			return nil
		}
		count++
		if remember {
			live = append(live, p.Key)
		}
		return nil
	})
	if err != nil {
		return 0, nil, storageErr("scan", err)
	}
	return count, live, nil
}

// errStopScan ends a scan early from its callback.
var errStopScan = errors.New("mvcc: scan stopped")

// resolveAt turns a key's latest version into its live version at rev,
// looking into history when the latest version is newer than rev.
func (b *Backend) resolveAt(ctx context.Context, key []byte, latest Version, value []byte, rev int64) (entry, bool, error) {
	if latest.ModRev <= rev {
		if latest.Tombstone {
			return entry{}, false, nil
		}
		return entry{key: key, hdr: latest, value: value}, true, nil
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
	h.ModRev = r
	if h.Tombstone {
		return entry{}, false, nil
	}
	return entry{key: key, hdr: h, value: val}, true, nil
}

// buildRange applies etcd's Range options to the live entries of a range.
// Count is the number of live keys in the range, whatever the limit and
// filters; More reports that the limit cut the result.
func buildRange(req *pb.RangeRequest, entries []entry, count int) *pb.RangeResponse {
	resp := &pb.RangeResponse{Count: int64(count)}
	if req.CountOnly {
		return resp
	}
	kept := entries
	if filtered(req) {
		kept = make([]entry, 0, len(entries))
		for _, e := range entries {
			if req.MinModRevision != 0 && e.hdr.ModRev < req.MinModRevision ||
				req.MaxModRevision != 0 && e.hdr.ModRev > req.MaxModRevision ||
				req.MinCreateRevision != 0 && e.hdr.CreateRev < req.MinCreateRevision ||
				req.MaxCreateRevision != 0 && e.hdr.CreateRev > req.MaxCreateRevision {
				continue
			}
			kept = append(kept, e)
		}
	}
	// The entries are in key order. etcd then sorts them with sort.Sort,
	// which is not stable: entries with equal sort keys end up in the
	// order its algorithm leaves them, and DESCEND is the same algorithm
	// over the reversed comparison, not a reversal of the ascending order.
	// Using the same algorithm with the same comparisons over the same
	// input gives the same order.
	order := req.SortOrder
	switch {
	case order == pb.RangeRequest_NONE && req.SortTarget != pb.RangeRequest_KEY:
		// A sort target without an order sorts ascending.
		order = pb.RangeRequest_ASCEND
	case order == pb.RangeRequest_ASCEND && req.SortTarget == pb.RangeRequest_KEY:
		// Already in that order.
		order = pb.RangeRequest_NONE
	}
	if req.Limit > 0 && limitBeforeSort(req) && int64(len(kept)) > req.Limit+1 {
		// A caller that read the whole range (a Txn's read) still sorts
		// only what etcd would have read.
		kept = kept[:req.Limit+1]
	}
	if order != pb.RangeRequest_NONE {
		s := entrySort{target: req.SortTarget, es: kept}
		if order == pb.RangeRequest_DESCEND {
			sort.Sort(sort.Reverse(s))
		} else {
			sort.Sort(s)
		}
	}
	if req.Limit > 0 && int64(len(kept)) > req.Limit {
		kept = kept[:req.Limit]
		resp.More = true
	}
	if req.Limit > 0 && int64(len(kept)) == req.Limit && int64(count) > req.Limit && plainOrder(req) {
		// Entries past the limit were only counted.
		resp.More = true
	}
	resp.Kvs = make([]*mvccpb.KeyValue, len(kept))
	for i := range kept {
		resp.Kvs[i] = kept[i].keyValue(!req.KeysOnly)
	}
	return resp
}

// entrySort orders entries by one sort target. Less compares integers by
// the sign of their difference, as etcd does, so that even values whose
// difference overflows compare as they do in etcd.
type entrySort struct {
	target pb.RangeRequest_SortTarget
	es     []entry
}

func (s entrySort) Len() int      { return len(s.es) }
func (s entrySort) Swap(i, j int) { s.es[i], s.es[j] = s.es[j], s.es[i] }

func (s entrySort) Less(i, j int) bool {
	a, b := &s.es[i], &s.es[j]
	switch s.target {
	case pb.RangeRequest_VERSION:
		return a.hdr.Version-b.hdr.Version < 0
	case pb.RangeRequest_CREATE:
		return a.hdr.CreateRev-b.hdr.CreateRev < 0
	case pb.RangeRequest_MOD:
		return a.hdr.ModRev-b.hdr.ModRev < 0
	case pb.RangeRequest_VALUE:
		return bytes.Compare(a.value, b.value) < 0
	default:
		return bytes.Compare(a.key, b.key) < 0
	}
}
