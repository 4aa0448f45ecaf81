package etcdmetrics

import (
	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// mvccMetrics exports etcd 3.6's MVCC operation counters. etcd moves them
// when one of its MVCC transactions ends (storage/mvcc/metrics_txn.go):
// each Range, Put and DeleteRange the transaction made adds to its
// counter, and a transaction that made more than one of them adds one to
// txn_total. Engram's MVCC layer has no such transactions, so the counts
// are derived from each answered request's shape (mvccTxnsOf), which
// fixes how many MVCC transactions etcd would have run for it and what
// each did.
type mvccMetrics struct {
	ranges, puts, deletes, txns prometheus.Counter
	// leaseKeys is how many keys are attached to a lease: etcd deletes
	// each, one by one, in the MVCC transaction that revokes the lease
	// (lease/lessor.go, Revoke).
	leaseKeys func(id int64) int
}

func newMVCCMetrics(reg prometheus.Registerer, leaseKeys func(id int64) int) *mvccMetrics {
	m := &mvccMetrics{
		ranges:  counter("etcd_mvcc_range_total", "Total number of ranges seen by this member."),
		puts:    counter("etcd_mvcc_put_total", "Total number of puts seen by this member."),
		deletes: counter("etcd_mvcc_delete_total", "Total number of deletes seen by this member."),
		txns:    counter("etcd_mvcc_txn_total", "Total number of txns seen by this member."),

		leaseKeys: leaseKeys,
	}
	if reg != nil {
		reg.MustRegister(m.ranges, m.puts, m.deletes, m.txns)
	}
	return m
}

// answered counts the MVCC transactions etcd would have run for an
// answered request (Request.End). Failed requests count nothing:
// etcd rejects most of them before its MVCC layer is reached. A revoked
// lease's keys are counted as they were just before the revocation
// (revokedKeys; -1 for any other request), as the answer does not list
// them.
func (m *mvccMetrics) answered(req, resp any, revokedKeys int) {
	var txns [2]mvccTxn
	n := mvccTxnsInto(&txns, req, resp)
	if revokedKeys >= 0 {
		txns[0], n = mvccTxn{deletes: revokedKeys}, 1
	}
	for _, t := range txns[:n] {
		m.ranges.Add(float64(t.ranges))
		m.puts.Add(float64(t.puts))
		m.deletes.Add(float64(t.deletes))
		if t.ranges+t.puts+t.deletes > 1 {
			m.txns.Inc()
		}
	}
}

// mvccTxn is what one of etcd's MVCC transactions did.
type mvccTxn struct{ ranges, puts, deletes int }

func (t *mvccTxn) add(o mvccTxn) { t.ranges += o.ranges; t.puts += o.puts; t.deletes += o.deletes }

// mvccTxnsOf returns the MVCC transactions etcd 3.6 runs to answer req
// with resp (etcdserver/txn/txn.go). A compaction reads one key afterwards
// for the revision it answers with (etcdserver/apply/apply.go); a lease
// revocation's deletes are not derived here (the request does not say how
// many keys were attached).
func mvccTxnsOf(req, resp any) []mvccTxn {
	var txns [2]mvccTxn
	n := mvccTxnsInto(&txns, req, resp)
	return txns[:n]
}

// mvccTxnsInto is mvccTxnsOf writing into out, so that counting a request
// allocates nothing; it returns how many of out it filled.
func mvccTxnsInto(out *[2]mvccTxn, req, resp any) int {
	switch r := req.(type) {
	case *pb.RangeRequest:
		out[0] = mvccTxn{ranges: 1}
	case *pb.PutRequest:
		out[0] = putOps(r)
	case *pb.DeleteRangeRequest:
		out[0] = deleteOps(r)
	case *pb.CompactionRequest:
		out[0] = mvccTxn{ranges: 1}
	case *pb.TxnRequest:
		tr, ok := resp.(*pb.TxnResponse)
		if !ok {
			return 0
		}
		// etcd first evaluates the compares (and reads ignore_value /
		// ignore_lease Puts need) in a read transaction; a Txn that
		// writes ends it and runs its ops in a new write transaction,
		// a read-only one runs them in the same. etcd calls a Txn
		// read-only only if both branches hold nothing but Ranges: a
		// nested Txn, even one that only reads, makes it a write.
		check, ops := txnCheck(r, tr), txnOps(r, tr)
		if !onlyRanges(r) {
			out[0], out[1] = check, ops
			return 2
		}
		check.add(ops)
		out[0] = check
	default:
		return 0
	}
	return 1
}

// putOps: a Put reads the previous pair first when it must return or
// reuse it.
func putOps(r *pb.PutRequest) mvccTxn {
	t := mvccTxn{puts: 1}
	if r.PrevKv || r.IgnoreValue || r.IgnoreLease {
		t.ranges = 1
	}
	return t
}

// deleteOps: a DeleteRange reads the pairs it deletes only for prev_kv.
func deleteOps(r *pb.DeleteRangeRequest) mvccTxn {
	t := mvccTxn{deletes: 1}
	if r.PrevKv {
		t.ranges = 1
	}
	return t
}

// branch returns the ops of t that ran, as tr says.
func branch(t *pb.TxnRequest, tr *pb.TxnResponse) []*pb.RequestOp {
	if tr.GetSucceeded() {
		return t.Success
	}
	return t.Failure
}

// txnCheck counts the reads of etcd's compare and check pass: one Range
// per compare evaluated, down the nested Txns of the branches taken, and
// one per Put there that ignores its value or lease. etcd stops at the
// first compare that fails, which the answer does not say, so a failed
// Txn with several compares is counted as if the last one failed.
func txnCheck(t *pb.TxnRequest, tr *pb.TxnResponse) mvccTxn {
	c := mvccTxn{ranges: len(t.Compare)}
	for i, op := range branch(t, tr) {
		switch {
		case op.GetRequestTxn() != nil:
			c.add(txnCheck(op.GetRequestTxn(), nested(tr, i)))
		case op.GetRequestPut() != nil && (op.GetRequestPut().IgnoreValue || op.GetRequestPut().IgnoreLease):
			c.ranges++
		}
	}
	return c
}

// txnOps counts the ops of the branches taken, nested Txns included.
func txnOps(t *pb.TxnRequest, tr *pb.TxnResponse) mvccTxn {
	var c mvccTxn
	for i, op := range branch(t, tr) {
		switch {
		case op.GetRequestRange() != nil:
			c.ranges++
		case op.GetRequestPut() != nil:
			c.add(putOps(op.GetRequestPut()))
		case op.GetRequestDeleteRange() != nil:
			c.add(deleteOps(op.GetRequestDeleteRange()))
		case op.GetRequestTxn() != nil:
			c.add(txnOps(op.GetRequestTxn(), nested(tr, i)))
		}
	}
	return c
}

// nested returns the answer of the Txn op i of tr's branch, or nil.
func nested(tr *pb.TxnResponse, i int) *pb.TxnResponse {
	if rs := tr.GetResponses(); i < len(rs) {
		return rs[i].GetResponseTxn()
	}
	return nil
}

// onlyRanges reports whether etcd takes t for read-only (its
// IsTxnReadonly): every op of both branches, not nested, is a Range.
func onlyRanges(t *pb.TxnRequest) bool {
	return allRanges(t.Success) && allRanges(t.Failure)
}

func allRanges(ops []*pb.RequestOp) bool {
	for _, op := range ops {
		if op.GetRequestRange() == nil {
			return false
		}
	}
	return true
}
