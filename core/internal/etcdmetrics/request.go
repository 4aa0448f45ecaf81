package etcdmetrics

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Request is what etcd would do with one unary request, decided once when
// it arrives (Begin) and counted once it is answered (End). It is a value,
// so that counting a request allocates nothing.
type Request struct {
	m        *Metrics
	req      any
	proposal bool
	// revokedKeys is the number of keys attached to the lease a
	// LeaseRevokeRequest revokes, read before the revocation because the
	// answer does not list them; -1 for any other request.
	revokedKeys int
}

// Begin classifies req once the server's own checks (learner, leader,
// admin) let it through, as etcd counts only proposals made: a proposal is
// pending from now until End.
func (m *Metrics) Begin(req any) Request {
	r := Request{m: m, req: req, proposal: isProposal(req), revokedKeys: -1}
	if lr, ok := req.(*pb.LeaseRevokeRequest); ok {
		r.revokedKeys = m.mvcc.leaseKeys(lr.ID)
	}
	if r.proposal {
		m.proposalsPending.Inc()
	}
	return r
}

// End counts the request as etcd would once answered with resp, or failed
// with err: a proposal is no longer pending, and failed if it ended without
// being committed; the MVCC and lessor counters move for answered requests
// only (etcd rejects most failed ones before its MVCC layer).
func (r Request) End(resp any, err error) {
	if r.proposal {
		r.m.proposalsPending.Dec()
		r.m.proposalEnded(err)
	}
	if err == nil {
		r.m.mvcc.answered(r.req, resp, r.revokedKeys)
		r.m.lease.answered(resp)
	}
}

// proposalEnded counts a write request's raft proposal as etcd would when
// it ended with err: failed when it ended without being committed (etcd:
// the proposal was dropped, timed out or the request went away). Errors
// the request itself causes are answers, not failures.
func (m *Metrics) proposalEnded(err error) {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Internal:
		m.proposalsFailed.Inc()
	}
}

// isProposal reports whether etcd would put req through raft: writes,
// compaction, lease grants and revocations, and every Txn but one whose
// branches hold nothing but Ranges. A Txn that nests another goes through
// raft even when the nested one only reads (etcd's IsTxnReadonly looks at
// the top level alone), so it is counted too.
func isProposal(req any) bool {
	switch r := req.(type) {
	case *pb.PutRequest, *pb.DeleteRangeRequest, *pb.CompactionRequest, *pb.LeaseGrantRequest, *pb.LeaseRevokeRequest:
		return true
	case *pb.TxnRequest:
		return !onlyRanges(r)
	}
	return false
}
