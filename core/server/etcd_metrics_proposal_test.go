package server_test

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/engramkv/engram/core/kv/kvfault"
	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/engines/memkv"
)

// TestEtcdProposalMetrics checks what counts as a failed proposal: a write
// the engine could not commit does, as a proposal etcd could not commit
// does; a write refused for its own sake and a read-only Txn are no
// proposals that failed. It also checks the live lease count.
func TestEtcdProposalMetrics(t *testing.T) {
	t.Parallel()
	mem := memkv.New()
	t.Cleanup(func() { _ = mem.Close() })
	st := kvfault.Wrap(mem)
	n := startMetricsNode(t, server.Options{Store: st, Name: "proposals"})
	conn, err := grpc.NewClient(n.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kvc, lc := pb.NewKVClient(conn), pb.NewLeaseClient(conn)

	if _, err := kvc.Put(ctx, &pb.PutRequest{Key: []byte("a"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if _, err := kvc.Put(ctx, &pb.PutRequest{}); err == nil { // no key: refused, nothing proposed
		t.Fatal("Put without a key succeeded")
	}
	rng := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("a")}}}
	if _, err := kvc.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{rng}}); err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, n, "etcd_server_proposals_failed_total"); v != 0 {
		t.Fatalf("etcd_server_proposals_failed_total %v before any commit failed", v)
	}
	st.FailCommits(kvfault.Fault{Err: errors.New("injected: disk gone")})
	if _, err := kvc.Put(ctx, &pb.PutRequest{Key: []byte("b"), Value: []byte("v")}); err == nil {
		t.Fatal("Put succeeded though its commit failed")
	}
	if v := gauge(t, n, "etcd_server_proposals_failed_total"); v != 1 {
		t.Errorf("etcd_server_proposals_failed_total %v after a failed commit, want 1", v)
	}
	if v := gauge(t, n, "etcd_server_proposals_pending"); v != 0 {
		t.Errorf("etcd_server_proposals_pending %v with nothing in flight", v)
	}
	if v, rev := gauge(t, n, "etcd_server_proposals_committed_total"), gauge(t, n, "engram_mvcc_revision"); v != rev {
		t.Errorf("etcd_server_proposals_committed_total %v, revision %v", v, rev)
	}

	g, err := lc.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, n, "engram_lease_active"); v != 1 {
		t.Errorf("engram_lease_active %v after a grant", v)
	}
	if _, err := lc.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: g.ID}); err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, n, "engram_lease_active"); v != 0 {
		t.Errorf("engram_lease_active %v after the revoke", v)
	}
}
