package server_test

import (
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestDiffMembershipLoneMember: MoveLeader and MemberRemove on a one-member
// cluster answer as a one-member etcd 3.6 does: moving leadership to the
// member itself succeeds, to an unknown member is a bad transferee;
// removing the only member is refused, an unknown one is not found.
func TestDiffMembershipLoneMember(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	var (
		maint [2]pb.MaintenanceClient
		clus  [2]pb.ClusterClient
		self  [2]uint64
	)
	for i := range 2 {
		maint[i] = pb.NewMaintenanceClient(p.conn[i])
		clus[i] = pb.NewClusterClient(p.conn[i])
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
	for i := range 2 {
		if _, err := p.kv[i].Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte("v")}); err != nil {
			t.Errorf("%s after the refusals: %v", p.names[i], err)
		}
	}
}
