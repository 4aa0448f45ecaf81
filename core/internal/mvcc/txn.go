package mvcc

import (
	"bytes"
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Transaction evaluation inside a write group: the compares against the
// state before the transaction, the checks that make it all-or-nothing, and
// the puts, deletes and ranges of the branch taken.

// txn executes one transaction against the group's state.
func (g *group) txn(t *pb.TxnRequest) (*pb.TxnResponse, error) {
	path, err := g.comparePath(t)
	if err != nil {
		return nil, err
	}
	if err := g.check(t, path); err != nil {
		return nil, err
	}
	rev := g.rev + 1
	g.changes = g.changes[:0]
	resp, err := g.execTxn(t, path, rev)
	if err != nil {
		// check() ruled out every request error, so this is a storage
		// failure part-way through: the group's state is no longer
		// trustworthy.
		return nil, fmt.Errorf("%w: %w", errAbortGroup, err)
	}
	if len(g.changes) > 0 {
		g.rev = rev
		g.appendLog(rev)
	}
	return resp, nil
}

// comparePath evaluates every comparison of t and its nested transactions
// against the state before t, as etcd does, and records the branch taken at
// each level in depth-first order.
func (g *group) comparePath(t *pb.TxnRequest) ([]bool, error) {
	ok := true
	for _, c := range t.Compare {
		r, err := g.compare(c)
		if err != nil {
			return nil, err
		}
		if !r {
			ok = false
			break
		}
	}
	path := []bool{ok}
	for _, op := range branch(t, ok) {
		if nt := op.GetRequestTxn(); nt != nil {
			sub, err := g.comparePath(nt)
			if err != nil {
				return nil, err
			}
			path = append(path, sub...)
		}
	}
	return path, nil
}

func branch(t *pb.TxnRequest, ok bool) []*pb.RequestOp {
	if ok {
		return t.Success
	}
	return t.Failure
}

func (g *group) compare(c *pb.Compare) (bool, error) {
	keys, err := g.liveRange(c.Key, c.RangeEnd)
	if err != nil {
		return false, err
	}
	if len(keys) == 0 {
		if c.Target == pb.Compare_VALUE {
			// etcd: comparing the value of a missing key always fails.
			return false, nil
		}
		return compareHeader(c, header{}, nil), nil
	}
	for _, k := range keys {
		s := g.keys[string(k)]
		if !compareHeader(c, s.cur, s.value) {
			return false, nil
		}
	}
	return true, nil
}

func compareHeader(c *pb.Compare, h header, value []byte) bool {
	var r int
	switch c.Target {
	case pb.Compare_VALUE:
		r = bytes.Compare(value, c.GetValue())
	case pb.Compare_VERSION:
		r = cmpInt(h.version, c.GetVersion())
	case pb.Compare_CREATE:
		r = cmpInt(h.createRev, c.GetCreateRevision())
	case pb.Compare_MOD:
		r = cmpInt(h.modRev, c.GetModRevision())
	case pb.Compare_LEASE:
		r = cmpInt(h.lease, c.GetLease())
	}
	switch c.Result {
	case pb.Compare_EQUAL:
		return r == 0
	case pb.Compare_NOT_EQUAL:
		return r != 0
	case pb.Compare_GREATER:
		return r > 0
	case pb.Compare_LESS:
		return r < 0
	}
	// etcd's rule for a result it does not know: the compare holds. An
	// unknown target compares nothing (r is 0), also as in etcd.
	return true
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// check validates the puts on t's path before anything executes, so a
// transaction either applies whole or fails without side effects.
func (g *group) check(t *pb.TxnRequest, path []bool) error {
	_, err := g.checkOps(t, path)
	return err
}

func (g *group) checkOps(t *pb.TxnRequest, path []bool) ([]bool, error) {
	ok, rest := path[0], path[1:]
	for _, op := range branch(t, ok) {
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestPut:
			p := r.RequestPut
			if p.Lease != 0 && !p.IgnoreLease && !g.b.lessor.Exists(p.Lease) {
				return nil, ErrLeaseNotFound
			}
			if p.IgnoreValue || p.IgnoreLease {
				s, err := g.state(p.Key)
				if err != nil {
					return nil, err
				}
				if !s.live() {
					return nil, ErrKeyNotFound
				}
			}
		case *pb.RequestOp_RequestRange:
			if rv := r.RequestRange.Revision; rv > 0 {
				if rv > g.rev {
					return nil, ErrFutureRev
				}
				if rv < g.b.compactRev.Load() {
					return nil, ErrCompacted
				}
			}
		case *pb.RequestOp_RequestTxn:
			var err error
			if rest, err = g.checkOps(r.RequestTxn, rest); err != nil {
				return nil, err
			}
		}
	}
	return rest, nil
}

func (g *group) execTxn(t *pb.TxnRequest, path []bool, rev int64) (*pb.TxnResponse, error) {
	resp, _, err := g.execPath(t, path, rev)
	return resp, err
}

func (g *group) execPath(t *pb.TxnRequest, path []bool, rev int64) (*pb.TxnResponse, []bool, error) {
	ok, rest := path[0], path[1:]
	ops := branch(t, ok)
	resp := &pb.TxnResponse{Succeeded: ok, Responses: make([]*pb.ResponseOp, 0, len(ops))}
	for _, op := range ops {
		var out *pb.ResponseOp
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			rr, err := g.rangeOp(r.RequestRange)
			if err != nil {
				return nil, nil, err
			}
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
		case *pb.RequestOp_RequestPut:
			pr, err := g.put(r.RequestPut, rev)
			if err != nil {
				return nil, nil, err
			}
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: pr}}
		case *pb.RequestOp_RequestDeleteRange:
			dr, err := g.deleteRange(r.RequestDeleteRange, rev)
			if err != nil {
				return nil, nil, err
			}
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: dr}}
		case *pb.RequestOp_RequestTxn:
			tr, r2, err := g.execPath(r.RequestTxn, rest, rev)
			if err != nil {
				return nil, nil, err
			}
			rest = r2
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: tr}}
		default:
			return nil, nil, fmt.Errorf("mvcc: unknown request op %T", op.Request)
		}
		resp.Responses = append(resp.Responses, out)
	}
	return resp, rest, nil
}

// rangeOp serves a Range inside a write transaction: it sees the writes of
// earlier requests in the group and earlier ops of the same transaction. A
// revision, if given, must be the current one.
func (g *group) rangeOp(req *pb.RangeRequest) (*pb.RangeResponse, error) {
	if req.Revision > 0 && req.Revision != g.rev {
		if req.Revision > g.rev {
			return nil, ErrFutureRev
		}
		// A historical read inside a transaction reads committed history.
		unpin, err := g.b.pin(req.Revision)
		if err != nil {
			return nil, err
		}
		defer unpin()
		entries, count, err := g.b.entriesAt(context.Background(), req.Key, req.RangeEnd, req.Revision, -1)
		if err != nil {
			return nil, err
		}
		return buildRange(req, entries, count), nil
	}
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

func (g *group) put(p *pb.PutRequest, rev int64) (*pb.PutResponse, error) {
	s, err := g.state(p.Key)
	if err != nil {
		return nil, err
	}
	resp := &pb.PutResponse{}
	wasLive := s.live()
	var prev *mvccpb.KeyValue
	if wasLive {
		prev = (&entry{key: p.Key, hdr: s.cur, value: s.value}).keyValue(true)
		if p.PrevKv {
			resp.PrevKv = prev
		}
	}
	value, leaseID := p.Value, p.Lease
	if p.IgnoreValue {
		value = s.value
	}
	if p.IgnoreLease {
		leaseID = s.cur.lease
	}
	h := header{modRev: rev, createRev: rev, version: 1, lease: leaseID}
	if wasLive {
		h.createRev, h.version = s.cur.createRev, s.cur.version+1
	}
	g.stageVersion(p.Key, s, h, value, prev)
	return resp, nil
}

func (g *group) deleteRange(d *pb.DeleteRangeRequest, rev int64) (*pb.DeleteRangeResponse, error) {
	keys, err := g.liveRange(d.Key, d.RangeEnd)
	if err != nil {
		return nil, err
	}
	resp := &pb.DeleteRangeResponse{Deleted: int64(len(keys))}
	for _, k := range keys {
		s := g.keys[string(k)]
		prev := (&entry{key: k, hdr: s.cur, value: s.value}).keyValue(true)
		if d.PrevKv {
			resp.PrevKvs = append(resp.PrevKvs, prev)
		}
		g.stageVersion(k, s, header{modRev: rev, tombstone: true}, nil, prev)
	}
	return resp, nil
}
