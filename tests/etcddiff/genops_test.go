package etcddiff

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// Transactions, leases, watches and malformed requests.

// maxTxnOps is etcd's default limit on a transaction's operations, nested
// ones counted.
const maxTxnOps = 128

func (g *gen) compare() func(lidFunc) *pb.Compare {
	key := g.key()
	target, result := pb.Compare_CompareTarget(g.r.IntN(5)), pb.Compare_CompareResult(g.r.IntN(4))
	if g.on("compare-unknown") && g.chance(5) {
		if g.r.IntN(2) == 0 {
			target = 9
		} else {
			result = 7
		}
	}
	if target == pb.Compare_LEASE && (result == pb.Compare_GREATER || result == pb.Compare_LESS) {
		// Lease IDs the servers chose are mapped one to one, which keeps
		// equality but not order: GREATER and LESS would compare two
		// servers' unrelated random numbers.
		result = pb.Compare_CompareResult(g.r.IntN(2) * int(pb.Compare_NOT_EQUAL))
	}
	var end []byte
	if g.chance(15) {
		end = g.rangeEnd(key)
	}
	n := g.r.Int64N(g.rev + 2)
	val := g.value()
	if len(val) > 16 {
		val = val[:16]
	}
	lease := g.lease()
	return func(lid lidFunc) *pb.Compare {
		c := &pb.Compare{Key: key, RangeEnd: end, Target: target, Result: result}
		switch target {
		case pb.Compare_VERSION:
			c.TargetUnion = &pb.Compare_Version{Version: n % 4}
		case pb.Compare_CREATE:
			c.TargetUnion = &pb.Compare_CreateRevision{CreateRevision: n}
		case pb.Compare_MOD:
			c.TargetUnion = &pb.Compare_ModRevision{ModRevision: n}
		case pb.Compare_VALUE:
			c.TargetUnion = &pb.Compare_Value{Value: val}
		case pb.Compare_LEASE:
			c.TargetUnion = &pb.Compare_Lease{Lease: lid(lease)}
		default:
			c.TargetUnion = &pb.Compare_Version{Version: n % 4}
		}
		return c
	}
}

// requestOp draws one operation of a transaction at depth (1 = top).
func (g *gen) requestOp(depth int) func(lidFunc) *pb.RequestOp {
	switch n := g.r.IntN(10); {
	case n < 3:
		r := g.rangeReq()
		if g.on("range-rev") && g.chance(30) {
			// A read at an explicit revision among the writes.
			r.Revision = g.revision()
		}
		return func(lidFunc) *pb.RequestOp {
			return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}}
		}
	case n < 6:
		b := g.putReq()
		return func(lid lidFunc) *pb.RequestOp {
			return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: b(lid)}}
		}
	case n < 8:
		r := g.deleteReq()
		return func(lidFunc) *pb.RequestOp {
			return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: r}}
		}
	default:
		if depth >= 3 || !g.on("txn-nested") {
			return g.requestOp(depth)
		}
		b := g.txnReq(depth + 1)
		return func(lid lidFunc) *pb.RequestOp {
			return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: b(lid)}}
		}
	}
}

func (g *gen) txnReq(depth int) func(lidFunc) *pb.TxnRequest {
	var cmps []func(lidFunc) *pb.Compare
	for range g.r.IntN(3) {
		cmps = append(cmps, g.compare())
	}
	branch := func() []func(lidFunc) *pb.RequestOp {
		var ops []func(lidFunc) *pb.RequestOp
		for range g.r.IntN(4) {
			ops = append(ops, g.requestOp(depth))
		}
		if len(ops) > 0 && g.chance(15) {
			// The same key written twice, or written and deleted.
			ops = append(ops, ops[g.r.IntN(len(ops))])
		}
		return ops
	}
	succ, fail := branch(), branch()
	top := depth == 1
	return func(lid lidFunc) *pb.TxnRequest {
		t := &pb.TxnRequest{}
		for _, c := range cmps {
			t.Compare = append(t.Compare, c(lid))
		}
		for _, o := range succ {
			t.Success = append(t.Success, o(lid))
		}
		for _, o := range fail {
			t.Failure = append(t.Failure, o(lid))
		}
		if top && walkTxn(t, func(op *pb.RequestOp) bool { return op.GetRequestDeleteRange() != nil }) {
			// etcd 3.6 checks a Put's ignore_value and ignore_lease against
			// the store as it was before the transaction, and panics (the
			// whole server exits) when an earlier op of the same
			// transaction deleted the key: a Txn [DeleteRange k, Put k
			// ignore_value] crashes it. The generator does not send what
			// kills the oracle.
			walkTxn(t, func(op *pb.RequestOp) bool {
				if p := op.GetRequestPut(); p != nil {
					p.IgnoreValue, p.IgnoreLease = false, false
				}
				return false
			})
		}
		return t
	}
}

// walkTxn calls f on every op of t, nested ones included, and reports
// whether f returned true for any.
func walkTxn(t *pb.TxnRequest, f func(*pb.RequestOp) bool) bool {
	found := false
	for _, ops := range [][]*pb.RequestOp{t.Success, t.Failure} {
		for _, op := range ops {
			if f(op) {
				found = true
			}
			if n := op.GetRequestTxn(); n != nil && walkTxn(n, f) {
				found = true
			}
		}
	}
	return found
}

func (g *gen) txnOp() *op {
	if g.on("txn-big") && g.chance(2) {
		return g.bigTxn()
	}
	b := g.txnReq(1)
	class := "txn"
	probe := b(func(id int64) int64 { return id })
	if walkTxn(probe, func(op *pb.RequestOp) bool { return op.GetRequestPut() != nil }) {
		// etcd's duplicate-key rule reads a delete's range end literally,
		// so a from-key delete ("\x00") never conflicts with a put: the
		// transaction is accepted and changes the put's key twice in one
		// revision. After a compaction past that revision, etcd 3.6 exits
		// on the next read of the key ("range failed to find revision
		// pair", mvcc/kvstore_txn.go). Such deletes end
		// at the prefix end instead, where the rule applies. The delete
		// requests are the builder's own, shared by every build, and this
		// runs before any.
		walkTxn(probe, func(op *pb.RequestOp) bool {
			if d := op.GetRequestDeleteRange(); d != nil && len(d.RangeEnd) == 1 && d.RangeEnd[0] == 0 {
				d.RangeEnd = prefixEnd(d.Key)
			}
			return false
		})
	}
	for _, ops := range [][]*pb.RequestOp{probe.Success, probe.Failure} {
		for _, o := range ops {
			if _, ok := o.Request.(*pb.RequestOp_RequestTxn); ok {
				class = "txn-nested"
			}
		}
	}
	return noStream(&op{class: class, build: func(lid lidFunc) any { return b(lid) }})
}

// bigTxn is a transaction at or just past the op limit, flat or with the
// ops in a nested transaction.
func (g *gen) bigTxn() *op {
	n := maxTxnOps - 1 + g.r.IntN(3)
	var ops []*pb.RequestOp
	for range n {
		ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: g.key()}}})
	}
	t := &pb.TxnRequest{Success: ops}
	if g.chance(50) {
		first := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: g.key(), Value: []byte("big")}}}
		t = &pb.TxnRequest{Success: []*pb.RequestOp{first, {Request: &pb.RequestOp_RequestTxn{RequestTxn: t}}}}
	}
	return noStream(&op{class: "txn-big", build: func(lidFunc) any { return t }})
}

// TTLs are long: a lease expiring during the run would make the servers'
// revisions depend on timing. etcd raises shorter TTLs to its minimum
// (a few seconds), so TTL 0 or negative would expire mid-run too.
var ttls = []int64{3600, 7200, 86400, 9000000000, 9000000001}

func (g *gen) leaseOp() *op {
	some := func() int64 {
		switch n := g.r.IntN(10); {
		case n < 7 && len(g.leases) > 0:
			return g.leases[g.r.IntN(len(g.leases))]
		case n < 9 && len(g.revoked) > 0:
			return g.revoked[g.r.IntN(len(g.revoked))]
		default:
			return 1000 + g.r.Int64N(3)
		}
	}
	var build func(lidFunc) any
	class := "lease"
	switch n := g.r.IntN(10); {
	case n < 4:
		var id int64
		switch m := g.r.IntN(8); {
		case m < 4:
			id = 0 // the server chooses
		case m < 6:
			id = 1 + g.r.Int64N(40)
		case m < 7:
			id = -42 - g.r.Int64N(2)
		default:
			id = some() // a duplicate, mostly
		}
		ttl := ttls[g.r.IntN(len(ttls))]
		build = func(lid lidFunc) any { return &pb.LeaseGrantRequest{ID: lid(id), TTL: ttl} }
	case n < 5:
		id := some()
		build = func(lid lidFunc) any { return &pb.LeaseRevokeRequest{ID: lid(id)} }
	case n < 7:
		class = "lease-ttl"
		id, keys := some(), g.chance(60)
		build = func(lid lidFunc) any { return &pb.LeaseTimeToLiveRequest{ID: lid(id), Keys: keys} }
	case n < 8:
		class = "lease-list"
		build = func(lidFunc) any { return &pb.LeaseLeasesRequest{} }
	default:
		id := some()
		class = "keepalive"
		build = func(lid lidFunc) any { return &pb.LeaseKeepAliveRequest{ID: lid(id)} }
	}
	return noStream(&op{class: class, build: build})
}

func (g *gen) watchOp() *op {
	s := g.r.IntN(nStreams)
	sm := &g.streams[s]
	n := g.r.IntN(10)
	switch {
	case n < 2 && len(sm.active) > 0:
		// Cancel an active watcher, or one that is not there.
		id := int64(-1)
		for a := range sm.active {
			if id < 0 || a < id {
				id = a
			}
		}
		if g.chance(20) {
			id = 500 + g.r.Int64N(3)
		}
		req := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: id}}}
		_, active := sm.active[id]
		return &op{class: "watch", stream: s, ctrl: active, build: func(lidFunc) any { return req }}
	case n < 3 && g.on("progress") && !sm.blocked(g.rev):
		// Not while a watcher starts ahead of the store: etcd drops such
		// a request, Engram answers it once the store got there (the
		// README's deliberate difference for watchers catching up).
		req := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}
		return &op{class: "progress", stream: s, build: func(lidFunc) any { return req }}
	}
	if len(sm.active) >= 6 {
		return nil // enough watchers on this stream; draw again
	}
	key := g.key()
	c := &pb.WatchCreateRequest{Key: key, RangeEnd: g.rangeEnd(key), PrevKv: g.chance(30), Fragment: g.chance(20)}
	if g.chance(20) {
		c.Filters = append(c.Filters, pb.WatchCreateRequest_NOPUT)
	}
	if g.chance(20) {
		c.Filters = append(c.Filters, pb.WatchCreateRequest_NODELETE)
	}
	if g.chance(20) {
		c.WatchId = 1 + g.r.Int64N(8) // explicit; often a duplicate
	}
	class := "watch"
	catchUp := false
	if g.chance(15) {
		switch m := g.r.IntN(10); {
		case m < 3 && g.on("watch-past") && !sm.blocked(g.rev):
			// A past revision (compacted ones included): etcd replays the
			// history from it in the background.
			c.StartRevision = 1 + g.r.Int64N(g.rev)
			class, catchUp = "watch-past", true
		case m < 6 && g.on("watch-future"):
			c.StartRevision = g.rev + 1 + g.r.Int64N(2)
			class = "watch-future"
		case g.on("watch-negative"):
			c.StartRevision = -1 - g.r.Int64N(3)
			class = "watch-negative"
		}
	}
	req := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}}
	sm.open = true
	return &op{class: class, stream: s, ctrl: true, catchUp: catchUp, build: func(lidFunc) any { return req }}
}

// observeWatch updates a stream's model from one of the oracle's watch
// responses; o is the operation whose responses these are.
func (g *gen) observeWatch(s int, o *op, r *pb.WatchResponse) {
	sm := &g.streams[s]
	switch {
	case r.Canceled:
		delete(sm.active, r.WatchId)
	case r.Created && r.WatchId >= 0:
		// A created response comes only in answer to a create.
		c := o.build(func(id int64) int64 { return id }).(*pb.WatchRequest).GetCreateRequest()
		sm.active[r.WatchId] = watcher{start: c.GetStartRevision(), keys: keySpan(c.GetKey(), c.GetRangeEnd())}
	}
}

// malformedOp draws a request etcd refuses, or accepts against intuition.
func (g *gen) malformedOp() *op {
	var r any
	switch g.r.IntN(8) {
	case 0:
		r = &pb.RangeRequest{}
	case 1:
		r = &pb.PutRequest{Value: []byte("v")}
	case 2:
		r = &pb.DeleteRangeRequest{}
	case 3:
		r = &pb.RangeRequest{Key: g.key(), SortOrder: 3 + pb.RangeRequest_SortOrder(g.r.IntN(2))}
	case 4:
		r = &pb.RangeRequest{Key: g.key(), RangeEnd: []byte{0}, SortTarget: 5 + pb.RangeRequest_SortTarget(g.r.IntN(2)), SortOrder: pb.RangeRequest_SortOrder(g.r.IntN(3))}
	case 5:
		r = &pb.TxnRequest{Success: []*pb.RequestOp{{}}}
	case 6:
		r = &pb.TxnRequest{Compare: []*pb.Compare{{Target: pb.Compare_VALUE, TargetUnion: &pb.Compare_Value{}}}}
	default:
		r = &pb.RangeRequest{Key: g.key(), Limit: -1 - g.r.Int64N(2)}
	}
	return noStream(&op{class: "malformed", build: func(lidFunc) any { return r }})
}
