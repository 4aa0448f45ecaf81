package etcdmetrics

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestIsProposal pins which requests etcd 3.6 sends through raft
// (etcdserver/v3_server.go Txn, txn.IsTxnReadonly): a Txn of Ranges only is
// served locally; anything else in either branch, a nested read-only Txn
// included, is a proposal.
func TestIsProposal(t *testing.T) {
	t.Parallel()
	rng := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("a")}}}
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("a")}}}
	nestedRead := &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: []*pb.RequestOp{rng}}}}
	for _, c := range []struct {
		name string
		req  any
		want bool
	}{
		{"range", &pb.RangeRequest{Key: []byte("a")}, false},
		{"put", &pb.PutRequest{Key: []byte("a")}, true},
		{"delete", &pb.DeleteRangeRequest{Key: []byte("a")}, true},
		{"compact", &pb.CompactionRequest{Revision: 1}, true},
		{"lease grant", &pb.LeaseGrantRequest{TTL: 5}, true},
		{"lease revoke", &pb.LeaseRevokeRequest{ID: 1}, true},
		{"lease time-to-live", &pb.LeaseTimeToLiveRequest{ID: 1}, false},
		{"empty txn", &pb.TxnRequest{}, false},
		{"txn of ranges", &pb.TxnRequest{Success: []*pb.RequestOp{rng}, Failure: []*pb.RequestOp{rng}}, false},
		{"txn put in failure", &pb.TxnRequest{Success: []*pb.RequestOp{rng}, Failure: []*pb.RequestOp{put}}, true},
		{"txn nesting a read-only txn", &pb.TxnRequest{Success: []*pb.RequestOp{nestedRead}}, true},
	} {
		if got := isProposal(c.req); got != c.want {
			t.Errorf("%s: isProposal = %v, want %v", c.name, got, c.want)
		}
	}
}
