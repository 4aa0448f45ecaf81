package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/internal/mvcc"
)

func put(k string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k)}}}
}

func del(k, end string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(k), RangeEnd: []byte(end)}}}
}

func txn(success, failure []*pb.RequestOp) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: success, Failure: failure}}}
}

// widePuts is n puts of distinct keys, the last one repeating the first
// when dup is set: wider than the branches checked pairwise.
func widePuts(n int, dup bool) []*pb.RequestOp {
	ops := make([]*pb.RequestOp, n)
	for i := range ops {
		ops[i] = put(fmt.Sprint("k", i))
	}
	if dup {
		ops[n-1] = put("k0")
	}
	return ops
}

func TestCheckTxnIntervals(t *testing.T) {
	l := Limits{}.withDefaults()
	tests := []struct {
		name string
		txn  *pb.TxnRequest
		want error
	}{
		{"distinct puts", &pb.TxnRequest{Success: []*pb.RequestOp{put("a"), put("b")}}, nil},
		{"same key in both branches", &pb.TxnRequest{Success: []*pb.RequestOp{put("a")}, Failure: []*pb.RequestOp{put("a")}}, nil},
		{"duplicate put", &pb.TxnRequest{Success: []*pb.RequestOp{put("a"), put("a")}}, rpctypes.ErrGRPCDuplicateKey},
		{"put inside delete range", &pb.TxnRequest{Success: []*pb.RequestOp{del("a", "c"), put("b")}}, rpctypes.ErrGRPCDuplicateKey},
		{"put before a delete covering it", &pb.TxnRequest{Success: []*pb.RequestOp{put("b"), del("a", "c")}}, rpctypes.ErrGRPCDuplicateKey},
		{"duplicate put in a wide branch", &pb.TxnRequest{Success: widePuts(smallBranch+4, true)}, rpctypes.ErrGRPCDuplicateKey},
		{"distinct puts in a wide branch", &pb.TxnRequest{Success: widePuts(smallBranch+4, false)}, nil},
		{"put outside delete range", &pb.TxnRequest{Success: []*pb.RequestOp{del("a", "c"), put("c")}}, nil},
		// etcd's rule reads a range end literally: "\x00" covers nothing.
		{"put inside from-key delete", &pb.TxnRequest{Success: []*pb.RequestOp{del("a", "\x00"), put("zz")}}, nil},
		{"put before from-key delete", &pb.TxnRequest{Success: []*pb.RequestOp{put("foo/bar"), del("foo", "\x00")}}, nil},
		{"inverted delete range", &pb.TxnRequest{Success: []*pb.RequestOp{del("m", "c"), put("d")}}, nil},
		{"nested then deletes what else puts", &pb.TxnRequest{Success: []*pb.RequestOp{txn([]*pb.RequestOp{del("k", "")}, []*pb.RequestOp{put("k")})}}, nil},
		{"nested put, later nested delete", &pb.TxnRequest{Success: []*pb.RequestOp{txn([]*pb.RequestOp{put("k")}, nil), txn([]*pb.RequestOp{del("k", "")}, nil)}}, nil},
		{"nested delete, later nested put", &pb.TxnRequest{Success: []*pb.RequestOp{txn([]*pb.RequestOp{del("k", "")}, nil), txn([]*pb.RequestOp{put("k")}, nil)}}, rpctypes.ErrGRPCDuplicateKey},
		{"nested delete, outer put after", &pb.TxnRequest{Success: []*pb.RequestOp{txn([]*pb.RequestOp{del("k", "")}, nil), put("k")}}, rpctypes.ErrGRPCDuplicateKey},
		{"else put equal to an earlier nested put", &pb.TxnRequest{Success: []*pb.RequestOp{txn([]*pb.RequestOp{put("k")}, nil), txn(nil, []*pb.RequestOp{put("k")})}}, rpctypes.ErrGRPCDuplicateKey},
		{"nested branches may overlap each other", &pb.TxnRequest{Success: []*pb.RequestOp{txn([]*pb.RequestOp{put("a")}, []*pb.RequestOp{put("a")})}}, nil},
		{"nested overlaps outer", &pb.TxnRequest{Success: []*pb.RequestOp{put("a"), txn([]*pb.RequestOp{put("a")}, nil)}}, rpctypes.ErrGRPCDuplicateKey},
		{"nested put in outer delete", &pb.TxnRequest{Success: []*pb.RequestOp{del("a", "z"), txn(nil, []*pb.RequestOp{put("m")})}}, rpctypes.ErrGRPCDuplicateKey},
		{"empty key", &pb.TxnRequest{Success: []*pb.RequestOp{put("")}}, rpctypes.ErrGRPCEmptyKey},
		{"empty op", &pb.TxnRequest{Success: []*pb.RequestOp{{}}}, rpctypes.ErrGRPCKeyNotFound},
	}
	for _, tc := range tests {
		err := l.checkTxn(tc.txn)
		if fmt.Sprint(err) != fmt.Sprint(tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	many := &pb.TxnRequest{}
	for i := range 129 {
		many.Compare = append(many.Compare, &pb.Compare{Key: []byte(fmt.Sprint(i))})
	}
	if err := l.checkTxn(many); err != rpctypes.ErrGRPCTooManyOps {
		t.Errorf("129 compares: %v", err)
	}
}

// TestCheckTxnOpsBudget: a nested transaction may be as wide as what its
// parent's widest list left, not the full limit.
func TestCheckTxnOpsBudget(t *testing.T) {
	l := Limits{MaxTxnOps: 4}.withDefaults()
	nested := func(n int) *pb.RequestOp {
		var ops []*pb.RequestOp
		for i := range n {
			ops = append(ops, put(fmt.Sprint("n", i)))
		}
		return txn(ops, nil)
	}
	for _, tc := range []struct {
		outer, inner int
		want         error
	}{
		{1, 3, rpctypes.ErrGRPCTooManyOps}, // 2 outer ops (the nested txn is one) leave 2
		{1, 2, nil},
		{2, 2, rpctypes.ErrGRPCTooManyOps},
		{2, 1, nil},
		{0, 3, nil},
		{0, 4, rpctypes.ErrGRPCTooManyOps},
	} {
		ops := []*pb.RequestOp{nested(tc.inner)}
		for i := range tc.outer {
			ops = append(ops, put(fmt.Sprint("o", i)))
		}
		if err := l.checkTxn(&pb.TxnRequest{Success: ops}); fmt.Sprint(err) != fmt.Sprint(tc.want) {
			t.Errorf("%d outer ops beside a nested txn of %d: got %v, want %v", tc.outer, tc.inner, err, tc.want)
		}
	}
}

func TestKeyLimitCountsEscapedBytes(t *testing.T) {
	l := Limits{MaxKeyBytes: 10}.withDefaults()
	if err := l.checkKey([]byte(strings.Repeat("a", 10))); err != nil {
		t.Errorf("10-byte key refused: %v", err)
	}
	err := l.checkKey([]byte("aaaaaa\x00\x00\x00\x00"))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "exceeds the limit") {
		t.Errorf("key that escapes to 14 bytes: %v", err)
	}
}

func TestToGRPC(t *testing.T) {
	tests := []struct {
		in   error
		want error
	}{
		{fmt.Errorf("read: %w", mvcc.ErrCompacted), rpctypes.ErrGRPCCompacted},
		{mvcc.ErrFutureRev, rpctypes.ErrGRPCFutureRev},
		{mvcc.ErrLeaseNotFound, rpctypes.ErrGRPCLeaseNotFound},
		{mvcc.ErrClosed, rpctypes.ErrGRPCStopped},
		{context.Canceled, rpctypes.ErrGRPCCanceled},
		{rpctypes.ErrGRPCEmptyKey, rpctypes.ErrGRPCEmptyKey},
	}
	for _, tc := range tests {
		if got := toGRPC(tc.in); got.Error() != tc.want.Error() {
			t.Errorf("toGRPC(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if got := toGRPC(fmt.Errorf("%w: disk gone", mvcc.ErrUnavailable)); status.Code(got) != codes.Unavailable || !strings.Contains(got.Error(), "disk gone") {
		t.Errorf("storage failure: %v", got)
	}
	if got := toGRPC(errors.New("boom")); status.Code(got) != codes.Internal {
		t.Errorf("unknown error: %v", got)
	}
	// etcd answers some errors with code Unknown on purpose; one wrapped
	// under another error came from below and is an internal failure.
	answer := status.Error(codes.Unknown, "auth: authentication failed, password was given for no password user")
	if got := toGRPC(answer); got != answer {
		t.Errorf("etcd's Unknown answer became %v", got)
	}
	if got := toGRPC(fmt.Errorf("engine: %w", status.Error(codes.Unknown, "tikv said no"))); status.Code(got) != codes.Internal || !strings.Contains(got.Error(), "tikv said no") {
		t.Errorf("a wrapped Unknown status from an engine: %v", got)
	}
}
