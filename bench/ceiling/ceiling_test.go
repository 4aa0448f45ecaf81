package ceiling

import (
	"context"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestStatelessPages: a reflector-style list (continue at lastKey+"\x00")
// gets ListKeys keys in pages of limit, then More=false.
func TestStatelessPages(t *testing.T) {
	s := New(Options{ValueSize: 16, ListKeys: 25})
	key, total, pages := []byte("/p/"), 0, 0
	for {
		resp, err := s.Range(context.Background(), &pb.RangeRequest{Key: key, RangeEnd: []byte("/p0"), Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		total += len(resp.Kvs)
		if resp.Count != int64(25-10*(pages-1)) {
			t.Errorf("page %d: count %d", pages, resp.Count)
		}
		if !resp.More {
			break
		}
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
		key = append(resp.Kvs[len(resp.Kvs)-1].Key, 0)
	}
	if total != 25 || pages != 3 {
		t.Errorf("%d keys in %d pages, want 25 in 3", total, pages)
	}
}

// TestWritesMoveRevision: every write answers with a new revision, reads
// with the current one.
func TestWritesMoveRevision(t *testing.T) {
	s := New(Options{})
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k")}}}
	r1, _ := s.Txn(context.Background(), &pb.TxnRequest{Success: []*pb.RequestOp{put}})
	r2, _ := s.Txn(context.Background(), &pb.TxnRequest{Success: []*pb.RequestOp{put}})
	if !r1.Succeeded || r2.Header.Revision != r1.Header.Revision+1 {
		t.Errorf("txn revisions %d then %d", r1.Header.Revision, r2.Header.Revision)
	}
	get, _ := s.Range(context.Background(), &pb.RangeRequest{Key: []byte("k")})
	if get.Header.Revision != r2.Header.Revision || len(get.Kvs) != 1 || len(get.Kvs[0].Value) != 512 {
		t.Errorf("range: %+v", get)
	}
}
