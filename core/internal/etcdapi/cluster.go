package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Membership carries out the member changes of cluster mode; the server
// implements it over the election and the member records. Its errors are
// answered as they are (the implementation returns etcd's gRPC errors).
type Membership interface {
	// MoveLeader hands leadership from this node, the leader, to target
	// and returns once target leads.
	MoveLeader(ctx context.Context, target uint64) error
	// RemoveMember forgets the member id and returns the members left.
	RemoveMember(ctx context.Context, id uint64) ([]*pb.Member, error)
}

// errNotEnoughStarted is what etcd 3.6 answers: its server error is not in
// its own gRPC error table, so clients get its text with codes.Unknown, not
// rpctypes.ErrGRPCMemberNotEnoughStarted's FailedPrecondition.
var errNotEnoughStarted = status.Error(codes.Unknown, "etcdserver: re-configuration failed due to not enough started members")

type clusterServer struct {
	pb.UnimplementedClusterServer
	s *Services
}

func (c *clusterServer) MemberList(ctx context.Context, r *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	members := []*pb.Member{c.s.self()}
	if c.s.members != nil {
		var err error
		if members, err = c.s.members(ctx); err != nil {
			return nil, toGRPC(err)
		}
	}
	return &pb.MemberListResponse{Header: c.s.header(c.s.current().Backend.Rev()), Members: members}, nil
}

func (s *Services) self() *pb.Member {
	return &pb.Member{ID: s.memberID, Name: s.name, ClientURLs: s.urls}
}

func (c *clusterServer) MemberAdd(context.Context, *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	return nil, unimplemented("member changes are not supported: Engram members share one storage engine and need no membership")
}

// MemberRemove forgets a member (only an admin may: authz_admin.go); a
// follower forwards it to the leader, which alone changes the members.
func (c *clusterServer) MemberRemove(ctx context.Context, r *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	if c.s.membership == nil {
		// A single node: etcd refuses to remove its only voting member (no
		// started member would be left for a quorum).
		if r.ID == c.s.memberID {
			return nil, errNotEnoughStarted
		}
		return nil, rpctypes.ErrGRPCMemberNotFound
	}
	role := c.s.current()
	if !role.leading() {
		if role.Leader == nil {
			return nil, rpctypes.ErrGRPCNoLeader
		}
		return pb.NewClusterClient(role.Leader).MemberRemove(forwardCtx(ctx), r)
	}
	members, err := c.s.membership.RemoveMember(ctx, r.ID)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.MemberRemoveResponse{Header: c.s.header(role.Backend.Rev()), Members: members}, nil
}

func (c *clusterServer) MemberUpdate(context.Context, *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	return nil, unimplemented("member changes are not supported: Engram members share one storage engine and need no membership")
}

func (c *clusterServer) MemberPromote(context.Context, *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	return nil, unimplemented("member changes are not supported: Engram members share one storage engine and need no membership")
}

// MoveLeader answers as etcd does: only the leader moves leadership (etcdctl
// finds it with Status), and only to a known member.
func (m *maintenanceServer) MoveLeader(ctx context.Context, r *pb.MoveLeaderRequest) (*pb.MoveLeaderResponse, error) {
	role := m.s.current()
	if m.s.membership == nil {
		// A single node leads; moving leadership to itself is done.
		if r.TargetID != m.s.memberID {
			return nil, rpctypes.ErrGRPCBadLeaderTransferee
		}
		return &pb.MoveLeaderResponse{Header: m.s.header(role.Backend.Rev())}, nil
	}
	if !role.leading() {
		return nil, rpctypes.ErrGRPCNotLeader
	}
	if err := m.s.membership.MoveLeader(ctx, r.TargetID); err != nil {
		return nil, toGRPC(err)
	}
	return &pb.MoveLeaderResponse{Header: m.s.header(m.s.current().Backend.Rev())}, nil
}
