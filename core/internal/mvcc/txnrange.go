package mvcc

import (
	"bytes"
	"context"
	"slices"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/internal/coder"
)

// A Range inside a write transaction. Without a revision it reads the
// latest state: earlier requests of the group and earlier ops of the same
// transaction included. With one (check() already refused one above the
// revision before the transaction or below the compacted one) it reads
// that revision exactly as etcd does, which is not the transaction's own
// writes: those belong to the revision being written.

// rangeOp serves a Range of the transaction writing rev.
func (g *group) rangeOp(req *pb.RangeRequest, rev int64) (*pb.RangeResponse, error) {
	at := req.Revision
	switch {
	case at <= 0 || at >= g.seenRev(rev):
		return g.rangeLatest(req)
	case at <= g.baseRev:
		// Committed before this group: the store has it.
		unpin, err := g.b.pin(at)
		if err != nil {
			return nil, err
		}
		defer unpin()
		entries, count, err := g.b.entriesAt(context.Background(), req.Key, req.RangeEnd, at, -1)
		if err != nil {
			return nil, err
		}
		return buildRange(req, entries, count), nil
	}
	return g.rangeInGroup(req, at)
}

func (g *group) rangeLatest(req *pb.RangeRequest) (*pb.RangeResponse, error) {
	keys, err := g.liveRange(req.Key, req.RangeEnd)
	if err != nil {
		return nil, err
	}
	entries := make([]entry, len(keys))
	for i, k := range keys {
		s := g.keys[string(k)]
		entries[i] = entry{key: k, hdr: s.cur, value: s.value}
	}
	return buildRange(req, entries, len(entries)), nil
}

// rangeInGroup reads revision at, written by an earlier transaction of
// this group and not committed yet: every key's version there comes from
// its state in the group (keys the group did not touch are as the store
// has them).
func (g *group) rangeInGroup(req *pb.RangeRequest, at int64) (*pb.RangeResponse, error) {
	keys, err := g.liveRange(req.Key, req.RangeEnd)
	if err != nil {
		return nil, err
	}
	// Keys no longer live may have been live at revision at.
	listed := make(map[string]bool, len(keys))
	for _, k := range keys {
		listed[string(k)] = true
	}
	for k, s := range g.keys {
		if !listed[k] && s.dirty && coder.InRange([]byte(k), req.Key, req.RangeEnd) {
			keys = append(keys, []byte(k))
		}
	}
	slices.SortFunc(keys, bytes.Compare)
	entries := make([]entry, 0, len(keys))
	for _, k := range keys {
		e, live, err := g.keys[string(k)].at(at)
		if err != nil {
			return nil, err
		}
		if live {
			e.key = k
			entries = append(entries, e)
		}
	}
	return buildRange(req, entries, len(entries)), nil
}

// staged is a key's version at the end of one revision of the group.
type staged struct {
	hdr    Version
	value  []byte
	exists bool
}

// at returns the key's version as of revision at (at above the group's
// base revision): the newest of its versions staged in the group at or
// below at, or the one it had before the group.
func (s *keyState) at(at int64) (entry, bool, error) {
	if s.exists && s.cur.ModRev <= at {
		return entry{hdr: s.cur, value: s.value}, !s.cur.Tombstone, nil
	}
	for i := len(s.past) - 1; i >= 0; i-- {
		if v := s.past[i]; v.exists && v.hdr.ModRev <= at {
			return entry{hdr: v.hdr, value: v.value}, !v.hdr.Tombstone, nil
		}
	}
	if s.base == nil {
		return entry{}, false, nil
	}
	h, val, err := decodeHeader(s.base)
	if err != nil {
		return entry{}, false, err
	}
	return entry{hdr: h, value: val}, !h.Tombstone, nil
}
