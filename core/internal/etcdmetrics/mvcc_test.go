package etcdmetrics

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestMVCCTxnsOf pins the counting rule request by request: which MVCC
// transactions etcd 3.6 runs and what each does.
func TestMVCCTxnsOf(t *testing.T) {
	t.Parallel()
	put := func(p *pb.PutRequest) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: p}}
	}
	rng := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("a")}}}
	del := &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("a"), PrevKv: true}}}
	cmp := &pb.Compare{Key: []byte("a")}
	nestedReq := &pb.TxnRequest{Compare: []*pb.Compare{cmp}, Success: []*pb.RequestOp{rng}, Failure: []*pb.RequestOp{put(&pb.PutRequest{})}}
	nestedOp := &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: nestedReq}}
	txnResp := func(ok bool, rs ...*pb.ResponseOp) *pb.TxnResponse {
		return &pb.TxnResponse{Succeeded: ok, Responses: rs}
	}
	nestedResp := func(ok bool) *pb.ResponseOp {
		return &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: txnResp(ok, &pb.ResponseOp{})}}
	}
	for _, tc := range []struct {
		name      string
		req, resp any
		want      []mvccTxn
	}{
		{"range", &pb.RangeRequest{}, &pb.RangeResponse{}, []mvccTxn{{ranges: 1}}},
		{"put", &pb.PutRequest{}, nil, []mvccTxn{{puts: 1}}},
		{"put prev_kv", &pb.PutRequest{PrevKv: true}, nil, []mvccTxn{{ranges: 1, puts: 1}}},
		{"put ignore_value", &pb.PutRequest{IgnoreValue: true}, nil, []mvccTxn{{ranges: 1, puts: 1}}},
		{"delete", &pb.DeleteRangeRequest{}, nil, []mvccTxn{{deletes: 1}}},
		{"delete prev_kv", &pb.DeleteRangeRequest{PrevKv: true}, nil, []mvccTxn{{ranges: 1, deletes: 1}}},
		{"compact reads its revision", &pb.CompactionRequest{}, nil, []mvccTxn{{ranges: 1}}},
		{"empty txn", &pb.TxnRequest{}, txnResp(true), []mvccTxn{{}}},
		{"read-only txn", &pb.TxnRequest{Compare: []*pb.Compare{cmp, cmp}, Success: []*pb.RequestOp{rng, rng}},
			txnResp(true, &pb.ResponseOp{}, &pb.ResponseOp{}), []mvccTxn{{ranges: 4}}},
		{"write txn", &pb.TxnRequest{Compare: []*pb.Compare{cmp}, Success: []*pb.RequestOp{put(&pb.PutRequest{PrevKv: true}), del}},
			txnResp(true, &pb.ResponseOp{}, &pb.ResponseOp{}), []mvccTxn{{ranges: 1}, {ranges: 2, puts: 1, deletes: 1}}},
		{"failed txn runs failure", &pb.TxnRequest{Compare: []*pb.Compare{cmp}, Success: []*pb.RequestOp{rng}, Failure: []*pb.RequestOp{put(&pb.PutRequest{})}},
			txnResp(false, &pb.ResponseOp{}), []mvccTxn{{ranges: 1}, {puts: 1}}},
		{"ignore_lease read at check", &pb.TxnRequest{Success: []*pb.RequestOp{put(&pb.PutRequest{IgnoreLease: true})}},
			txnResp(true, &pb.ResponseOp{}), []mvccTxn{{ranges: 1}, {ranges: 1, puts: 1}}},
		{"nested success (a write branch makes it a write txn)", &pb.TxnRequest{Success: []*pb.RequestOp{nestedOp}}, txnResp(true, nestedResp(true)), []mvccTxn{{ranges: 1}, {ranges: 1}}},
		{"nested failure writes", &pb.TxnRequest{Success: []*pb.RequestOp{nestedOp}}, txnResp(true, nestedResp(false)),
			[]mvccTxn{{ranges: 1}, {puts: 1}}},
		{"nested read-only txn is a write txn", &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: []*pb.RequestOp{rng}}}}}},
			txnResp(true, nestedResp(true)), []mvccTxn{{}, {ranges: 1}}},
	} {
		got := mvccTxnsOf(tc.req, tc.resp)
		if len(got) != len(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
			}
		}
	}
}
