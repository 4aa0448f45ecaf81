package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/internal/etcdtest"
)

// TestDiffMembershipLoneMember: MoveLeader and MemberRemove on a one-member
// cluster answer as a one-member etcd 3.6 does: moving leadership to the
// member itself succeeds, to an unknown member is a bad transferee;
// removing the only member is refused, an unknown one is not found.
func TestDiffMembershipLoneMember(t *testing.T) {
	etcdtest.Require(t)
	e := etcdtest.Start(t, etcdtest.Options{})
	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ec.Close() })
	gc := servertest.Start(t, servertest.Options{}).Client(t)
	// A hang guard, not a measurement.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := &pair{names: [2]string{"etcd", "engram"}}
	var (
		maint [2]pb.MaintenanceClient
		clus  [2]pb.ClusterClient
		self  [2]uint64
	)
	for i, c := range []*clientv3.Client{ec, gc} {
		maint[i] = pb.NewMaintenanceClient(c.ActiveConnection())
		clus[i] = pb.NewClusterClient(c.ActiveConnection())
		st, err := maint[i].Status(ctx, &pb.StatusRequest{})
		if err != nil {
			t.Fatalf("%s status: %v", p.names[i], err)
		}
		self[i] = st.Header.MemberId
	}
	const unknown = 0x1234
	showMove := func(*pb.MoveLeaderResponse) string { return "ok" }
	showRemove := func(r *pb.MemberRemoveResponse) string { return fmt.Sprintf("ok, %d members", len(r.Members)) }
	same(t, p, "move-leader to an unknown member", func(i int) (*pb.MoveLeaderResponse, error) {
		return maint[i].MoveLeader(ctx, &pb.MoveLeaderRequest{TargetID: unknown})
	}, showMove)
	same(t, p, "move-leader to itself", func(i int) (*pb.MoveLeaderResponse, error) {
		return maint[i].MoveLeader(ctx, &pb.MoveLeaderRequest{TargetID: self[i]})
	}, showMove)
	same(t, p, "member remove of an unknown member", func(i int) (*pb.MemberRemoveResponse, error) {
		return clus[i].MemberRemove(ctx, &pb.MemberRemoveRequest{ID: unknown})
	}, showRemove)
	same(t, p, "member remove of the only member", func(i int) (*pb.MemberRemoveResponse, error) {
		return clus[i].MemberRemove(ctx, &pb.MemberRemoveRequest{ID: self[i]})
	}, showRemove)
	// Both still serve.
	for i, c := range []*clientv3.Client{ec, gc} {
		if _, err := c.Put(ctx, "k", "v"); err != nil {
			t.Errorf("%s after the refusals: %v", p.names[i], err)
		}
	}
}
