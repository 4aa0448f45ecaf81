package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/server/servertest"
)

// showMembers prints what the member calls answer, without IDs and URLs
// (each server has its own, and the IDs order the list): per member,
// started or not and learner or not.
func showMembers(members []*pb.Member) string {
	var out []string
	for _, m := range members {
		out = append(out, fmt.Sprintf("[started=%v learner=%v peers=%d clients=%d]", m.Name != "", m.IsLearner, len(m.PeerURLs), len(m.ClientURLs)))
	}
	slices.Sort(out)
	return strings.Join(out, "")
}

// TestDiffMemberChanges: member add, promote, update, remove and
// move-leader with a learner answer on a one-node Engram cluster as on a
// one-member etcd 3.6, refusals included (the learner never starts, so it
// stays unstarted on both).
func TestDiffMemberChanges(t *testing.T) {
	t.Parallel()
	ec, _ := startEtcd(t)
	c := newCluster(t)
	node := c.nodes[c.add("lone", c.shared, servertest.Options{})]
	c.leader(-1)
	gc := node.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var (
		clus  [2]pb.ClusterClient
		maint [2]pb.MaintenanceClient
		self  [2]*pb.Member
	)
	p := &pair{names: [2]string{"etcd", "engram"}}
	for i, cl := range []*clientv3.Client{ec, gc} {
		clus[i] = pb.NewClusterClient(cl.ActiveConnection())
		maint[i] = pb.NewMaintenanceClient(cl.ActiveConnection())
		ml, err := clus[i].MemberList(ctx, &pb.MemberListRequest{})
		if err != nil || len(ml.Members) != 1 {
			t.Fatalf("%s member list: %+v %v", p.names[i], ml, err)
		}
		self[i] = ml.Members[0]
	}
	const (
		url     = "http://127.0.0.1:1"
		other   = "http://127.0.0.1:2"
		moved   = "http://127.0.0.1:3"
		unknown = 0x1234
	)
	var learner [2]uint64
	showAdd := func(r *pb.MemberAddResponse) string {
		return fmt.Sprintf("added learner=%v name=%q peers=%v, members %s", r.Member.IsLearner, r.Member.Name, r.Member.PeerURLs, showMembers(r.Members))
	}
	same(t, p, "add a learner", func(i int) (*pb.MemberAddResponse, error) {
		r, err := clus[i].MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: []string{url}, IsLearner: true})
		if err == nil {
			learner[i] = r.Member.ID
		}
		return r, err
	}, showAdd)
	// Adding the same peer URL again is not compared: etcd derives a new
	// member's ID from its peer URLs and the current second, so within the
	// same second it answers "member ID already exist" and later "Peer URLs
	// already exists", Engram's answer (TestClusterLearner).
	same(t, p, "add a second learner", func(i int) (*pb.MemberAddResponse, error) {
		return clus[i].MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: []string{other}, IsLearner: true})
	}, showAdd)

	showPromote := func(r *pb.MemberPromoteResponse) string { return "promoted, members " + showMembers(r.Members) }
	same(t, p, "promote the learner that never started", func(i int) (*pb.MemberPromoteResponse, error) {
		return clus[i].MemberPromote(ctx, &pb.MemberPromoteRequest{ID: learner[i]})
	}, showPromote)
	same(t, p, "promote a voting member", func(i int) (*pb.MemberPromoteResponse, error) {
		return clus[i].MemberPromote(ctx, &pb.MemberPromoteRequest{ID: self[i].ID})
	}, showPromote)
	same(t, p, "promote an unknown member", func(i int) (*pb.MemberPromoteResponse, error) {
		return clus[i].MemberPromote(ctx, &pb.MemberPromoteRequest{ID: unknown})
	}, showPromote)

	showUpdate := func(r *pb.MemberUpdateResponse) string { return "updated, members " + showMembers(r.Members) }
	same(t, p, "update an unknown member", func(i int) (*pb.MemberUpdateResponse, error) {
		return clus[i].MemberUpdate(ctx, &pb.MemberUpdateRequest{ID: unknown, PeerURLs: []string{moved}})
	}, showUpdate)
	same(t, p, "update the learner to the other member's peer URL", func(i int) (*pb.MemberUpdateResponse, error) {
		return clus[i].MemberUpdate(ctx, &pb.MemberUpdateRequest{ID: learner[i], PeerURLs: self[i].PeerURLs})
	}, showUpdate)
	same(t, p, "update the learner", func(i int) (*pb.MemberUpdateResponse, error) {
		return clus[i].MemberUpdate(ctx, &pb.MemberUpdateRequest{ID: learner[i], PeerURLs: []string{moved}})
	}, showUpdate)
	same(t, p, "member list", func(i int) (*pb.MemberListResponse, error) {
		return clus[i].MemberList(ctx, &pb.MemberListRequest{})
	}, func(r *pb.MemberListResponse) string { return showMembers(r.Members) })

	same(t, p, "move-leader to the learner", func(i int) (*pb.MoveLeaderResponse, error) {
		return maint[i].MoveLeader(ctx, &pb.MoveLeaderRequest{TargetID: learner[i]})
	}, func(*pb.MoveLeaderResponse) string { return "ok" })
	same(t, p, "status", func(i int) (*pb.StatusResponse, error) {
		return maint[i].Status(ctx, &pb.StatusRequest{})
	}, func(r *pb.StatusResponse) string { return fmt.Sprintf("learner=%v", r.IsLearner) })

	same(t, p, "remove the learner", func(i int) (*pb.MemberRemoveResponse, error) {
		return clus[i].MemberRemove(ctx, &pb.MemberRemoveRequest{ID: learner[i]})
	}, func(r *pb.MemberRemoveResponse) string { return "removed, members " + showMembers(r.Members) })
}
