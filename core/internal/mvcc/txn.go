package mvcc

import (
	"bytes"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/internal/coder"
)

// Transaction evaluation inside a write group: the compares against the
// state before the transaction, the checks that make it all-or-nothing, and
// the puts, deletes and ranges of the branch taken.

// txn executes one transaction against the group's state. single marks a
// Put or DeleteRange request rather than a Txn: etcd checks such a put's
// lease before its key, a transaction's put the other way round.
func (g *group) txn(t *pb.TxnRequest, single bool) (*txnOut, error) {
	path, err := g.comparePath(t, g.path[:0])
	g.path = path[:0]
	if err != nil {
		return nil, err
	}
	if err := g.check(t, path, single); err != nil {
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
// The path is appended to dst.
func (g *group) comparePath(t *pb.TxnRequest, dst []bool) ([]bool, error) {
	ok := true
	for _, c := range t.Compare {
		r, err := g.compare(c)
		if err != nil {
			return dst, err
		}
		if !r {
			ok = false
			break
		}
	}
	path := append(dst, ok)
	for _, op := range branch(t, ok) {
		if nt := op.GetRequestTxn(); nt != nil {
			var err error
			if path, err = g.comparePath(nt, path); err != nil {
				return path, err
			}
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
		return compareHeader(c, Version{}, nil), nil
	}
	for _, k := range keys {
		s := g.keys[string(k)]
		if !compareHeader(c, s.cur, s.value) {
			return false, nil
		}
	}
	return true, nil
}

func compareHeader(c *pb.Compare, h Version, value []byte) bool {
	var r int
	switch c.Target {
	case pb.Compare_VALUE:
		r = bytes.Compare(value, c.GetValue())
	case pb.Compare_VERSION:
		r = cmpInt(h.Version, c.GetVersion())
	case pb.Compare_CREATE:
		r = cmpInt(h.CreateRev, c.GetCreateRevision())
	case pb.Compare_MOD:
		r = cmpInt(h.ModRev, c.GetModRevision())
	case pb.Compare_LEASE:
		r = cmpInt(h.Lease, c.GetLease())
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

// check validates the ops on t's path before anything executes, so a
// transaction either applies whole or fails without side effects. The
// rules and their order are etcd's (the first failing op decides).
func (g *group) check(t *pb.TxnRequest, path []bool, single bool) error {
	c := txnCheck{g: g, single: single}
	_, err := c.ops(t, path)
	return err
}

// txnCheck walks a transaction's path in execution order.
type txnCheck struct {
	g      *group
	single bool
	// dels are the ranges deleted by the ops walked so far, as they
	// execute ("\x00" reaching to the end).
	dels []delRange
}

type delRange struct{ key, end []byte }

func (c *txnCheck) ops(t *pb.TxnRequest, path []bool) ([]bool, error) {
	ok, rest := path[0], path[1:]
	for _, op := range branch(t, ok) {
		var err error
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestPut:
			err = c.put(r.RequestPut)
		case *pb.RequestOp_RequestDeleteRange:
			c.dels = append(c.dels, delRange{r.RequestDeleteRange.Key, r.RequestDeleteRange.RangeEnd})
		case *pb.RequestOp_RequestRange:
			err = c.g.checkRangeRevision(r.RequestRange.Revision)
		case *pb.RequestOp_RequestTxn:
			rest, err = c.ops(r.RequestTxn, rest)
		}
		if err != nil {
			return nil, err
		}
	}
	return rest, nil
}

// put checks a put's lease and, with ignore_value or ignore_lease, that
// its key exists. In a Txn etcd checks the key first, in a Put request the
// lease first.
func (c *txnCheck) put(p *pb.PutRequest) error {
	if c.single {
		if err := c.lease(p); err != nil {
			return err
		}
	}
	if p.IgnoreValue || p.IgnoreLease {
		s, err := c.g.state(p.Key)
		if err != nil {
			return err
		}
		if !s.live() {
			return ErrKeyNotFound
		}
		// etcd checks against the state before the transaction and then
		// fails (crashes, in 3.6) executing a put whose key an earlier op
		// of the same transaction deleted; refuse it up front instead.
		for _, d := range c.dels {
			if coder.InRange(p.Key, d.key, d.end) {
				return ErrKeyNotFound
			}
		}
	}
	if !c.single {
		return c.lease(p)
	}
	return nil
}

func (c *txnCheck) lease(p *pb.PutRequest) error {
	if p.Lease != 0 && !p.IgnoreLease && !c.g.b.lessor.Exists(p.Lease) {
		return ErrLeaseNotFound
	}
	return nil
}

// checkRangeRevision is etcd's rule for a Range's revision inside a
// transaction, stricter than a plain Range's: any revision other than 0
// (negative ones too) must be neither above the current revision nor below
// the first one still readable.
func (g *group) checkRangeRevision(rev int64) error {
	switch {
	case rev == 0:
		return nil
	case rev > g.rev:
		return ErrFutureRev
	case rev < g.b.compactFloor():
		// The oldest readable revision is the compacted one, or -1
		// before any compaction: -1 means "current" until the first
		// compaction, Compact(0) included, and is refused after it.
		return ErrCompacted
	}
	return nil
}

func (g *group) execTxn(t *pb.TxnRequest, path []bool, rev int64) (*txnOut, error) {
	resp, _, err := g.execPath(t, path, rev)
	return resp, err
}

// execPath executes the branch path chose at each level. The headers of
// the responses inside are etcd's: a put's is the revision being written;
// a delete's and a range's are the revision before the transaction until
// the transaction changed something, then the one being written; a nested
// transaction's is empty. The transaction's own is set once it committed
// (runGroup).
func (g *group) execPath(t *pb.TxnRequest, path []bool, rev int64) (*txnOut, []bool, error) {
	ok, rest := path[0], path[1:]
	ops := branch(t, ok)
	to := new(txnOut)
	resp := &to.resp
	resp.Succeeded = ok
	if len(ops) <= len(to.ops) {
		resp.Responses = to.ops[:0:len(ops)]
	} else {
		resp.Responses = make([]*pb.ResponseOp, 0, len(ops))
	}
	for _, op := range ops {
		var out *pb.ResponseOp
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			rr, err := g.rangeOp(r.RequestRange, rev)
			if err != nil {
				return nil, nil, err
			}
			out = g.rangeAnswer(rr, rev)
		case *pb.RequestOp_RequestPut:
			o := &to.put
			if to.putUsed {
				o = &putOut{}
			}
			to.putUsed = true
			if err := g.put(r.RequestPut, rev, &o.resp); err != nil {
				return nil, nil, err
			}
			o.hdr.Revision = rev
			o.resp.Header = &o.hdr
			o.wrap.ResponsePut = &o.resp
			o.op.Response = &o.wrap
			out = &o.op
		case *pb.RequestOp_RequestDeleteRange:
			var err error
			if out, err = g.deleteRange(r.RequestDeleteRange, rev); err != nil {
				return nil, nil, err
			}
		case *pb.RequestOp_RequestTxn:
			nested, r2, err := g.execPath(r.RequestTxn, rest, rev)
			if err != nil {
				return nil, nil, err
			}
			rest = r2
			nested.resp.Header = &nested.hdr
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: &nested.resp}}
		default:
			return nil, nil, fmt.Errorf("mvcc: unknown request op %T", op.Request)
		}
		resp.Responses = append(resp.Responses, out)
	}
	return to, rest, nil
}

// rangeAnswer wraps a range's answer inside a transaction; its header is
// the revision the transaction has reached.
func (g *group) rangeAnswer(rr *pb.RangeResponse, rev int64) *pb.ResponseOp {
	o := &rangeOut{}
	rr.Header = g.seenHeader(&o.hdr, rev)
	o.wrap.ResponseRange = rr
	o.op.Response = &o.wrap
	return &o.op
}

// seenHeader sets hdr to the revision the transaction writing rev has
// reached (seenRev), the header of a range's or a delete's answer.
func (g *group) seenHeader(hdr *pb.ResponseHeader, rev int64) *pb.ResponseHeader {
	hdr.Revision = g.seenRev(rev)
	return hdr
}

// seenRev is the revision the transaction writing rev has reached: rev
// once it changed something, the one before until then.
func (g *group) seenRev(rev int64) int64 {
	if len(g.changes) > 0 {
		return rev
	}
	return rev - 1
}

// Responses are built from a few allocations each: the messages an op's
// answer consists of live in one struct (the writer builds one per op of
// every write, so each allocation saved is one per write).
type (
	txnOut struct {
		resp pb.TxnResponse
		hdr  pb.ResponseHeader // the transaction's own, set when it committed
		ops  [2]*pb.ResponseOp // room for the usual one or two ops' answers
		// put is the answer of the transaction's first put (most writes
		// are a create or an update of one key).
		put     putOut
		putUsed bool
	}
	putOut struct {
		op   pb.ResponseOp
		wrap pb.ResponseOp_ResponsePut
		resp pb.PutResponse
		hdr  pb.ResponseHeader
	}
	rangeOut struct {
		op   pb.ResponseOp
		wrap pb.ResponseOp_ResponseRange
		hdr  pb.ResponseHeader
	}
	deleteOut struct {
		op   pb.ResponseOp
		wrap pb.ResponseOp_ResponseDeleteRange
		resp pb.DeleteRangeResponse
		hdr  pb.ResponseHeader
	}
)

func (g *group) put(p *pb.PutRequest, rev int64, resp *pb.PutResponse) error {
	s, err := g.state(p.Key)
	if err != nil {
		return err
	}
	wasLive := s.live()
	o := newEvent(p.Key, s)
	if p.PrevKv {
		resp.PrevKv = o.ev.PrevKv
	}
	value, leaseID := p.Value, p.Lease
	if p.IgnoreValue {
		value = s.value
	}
	if p.IgnoreLease {
		leaseID = s.cur.Lease
	}
	h := Version{ModRev: rev, CreateRev: rev, Version: 1, Lease: leaseID}
	if wasLive {
		h.CreateRev, h.Version = s.cur.CreateRev, s.cur.Version+1
	}
	g.stageVersion(p.Key, s, h, value, o)
	return nil
}

// deleteRange stages the deletion of the live keys in d's range and
// answers it; the answer's header is the revision reached once they are
// staged.
func (g *group) deleteRange(d *pb.DeleteRangeRequest, rev int64) (*pb.ResponseOp, error) {
	keys, err := g.liveRange(d.Key, d.RangeEnd)
	if err != nil {
		return nil, err
	}
	out := &deleteOut{}
	resp := &out.resp
	resp.Deleted = int64(len(keys))
	for _, k := range keys {
		s := g.keys[string(k)]
		o := newEvent(k, s)
		if d.PrevKv {
			resp.PrevKvs = append(resp.PrevKvs, o.ev.PrevKv)
		}
		g.stageVersion(k, s, Version{ModRev: rev, Tombstone: true}, nil, o)
	}
	resp.Header = g.seenHeader(&out.hdr, rev)
	out.wrap.ResponseDeleteRange = resp
	out.op.Response = &out.wrap
	return &out.op, nil
}
