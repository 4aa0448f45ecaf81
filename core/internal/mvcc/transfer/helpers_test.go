package transfer

import (
	"context"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/kv"
)

// The few Backend helpers the transfer tests share with mvcc's own tests
// (mvcc_test.go, txnrange_test.go), which a test of another package cannot
// reach.

func open(t *testing.T, s kv.Store) *mvcc.Backend {
	t.Helper()
	b, err := mvcc.Open(context.Background(), mvcc.Options{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func put(t *testing.T, b *mvcc.Backend, k, v string) int64 {
	t.Helper()
	r, err := b.Put(context.Background(), &pb.PutRequest{Key: []byte(k), Value: []byte(v)})
	if err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
	return r.Header.Revision
}

func get(t *testing.T, b *mvcc.Backend, k string, rev int64) (*mvccpb.KeyValue, error) {
	t.Helper()
	r, err := b.Range(context.Background(), &pb.RangeRequest{Key: []byte(k), Revision: rev})
	if err != nil {
		return nil, err
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	return r.Kvs[0], nil
}

func putOp(key, value string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: []byte(value)}}}
}

func delOp(key, end string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(key), RangeEnd: []byte(end)}}}
}
