package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Membership carries out the member changes of cluster mode on the leader;
// the server implements it over the election and the member records. Its
// errors are answered as they are (the implementation returns etcd's gRPC
// errors).
type Membership interface {
	// MoveLeader hands leadership from this node, the leader, to target
	// and returns once target leads.
	MoveLeader(ctx context.Context, target uint64) error
	// AddMember records a member that has not started yet, reached at
	// peerURLs, and returns it and the members.
	AddMember(ctx context.Context, peerURLs []string, learner bool) (*pb.Member, []*pb.Member, error)
	// UpdateMember changes the peer URLs of member id and returns the
	// members.
	UpdateMember(ctx context.Context, id uint64, peerURLs []string) ([]*pb.Member, error)
	// PromoteMember makes the learner id a voting member and returns the
	// members.
	PromoteMember(ctx context.Context, id uint64) ([]*pb.Member, error)
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

// errNeedsCluster answers member changes that only a cluster can make.
func errNeedsCluster(what string) error {
	return unimplemented(what + " needs cluster mode (--cluster.enabled): a single node shares its store with no other member")
}

// MemberAdd records a member that will join: the node that starts with one
// of its peer URLs as advertised client URL takes its ID (members.go in
// package server). Only an admin may (authz_admin.go).
func (c *clusterServer) MemberAdd(ctx context.Context, r *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	if err := checkPeerURLs(r.PeerURLs); err != nil {
		return nil, err
	}
	if c.s.membership == nil {
		return nil, errNeedsCluster("member add")
	}
	return onLeader(ctx, c.s, r, pb.ClusterClient.MemberAdd, func(role *Role) (*pb.MemberAddResponse, error) {
		added, members, err := c.s.membership.AddMember(ctx, r.PeerURLs, r.IsLearner)
		if err != nil {
			return nil, toGRPC(err)
		}
		return &pb.MemberAddResponse{Header: c.s.header(role.Backend.Rev()), Member: added, Members: members}, nil
	})
}

// MemberRemove forgets a member (only an admin may: authz_admin.go); a
// follower forwards it to the leader, which alone changes the members. A
// single node is its only voting member: etcd refuses to remove it (no
// started member would be left for a quorum).
func (c *clusterServer) MemberRemove(ctx context.Context, r *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	return changeMember(ctx, c.s, r, r.ID, errNotEnoughStarted, pb.ClusterClient.MemberRemove,
		func() ([]*pb.Member, error) { return c.s.membership.RemoveMember(ctx, r.ID) },
		func(h *pb.ResponseHeader, m []*pb.Member) *pb.MemberRemoveResponse {
			return &pb.MemberRemoveResponse{Header: h, Members: m}
		})
}

// MemberUpdate changes where the other members reach a member (where
// followers forward while it leads). etcd does not check the URLs here;
// Engram does, as MemberAdd does, since a bad one would break forwarding.
func (c *clusterServer) MemberUpdate(ctx context.Context, r *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	if err := checkPeerURLs(r.PeerURLs); err != nil {
		return nil, err
	}
	return changeMember(ctx, c.s, r, r.ID, errNeedsCluster("member update"), pb.ClusterClient.MemberUpdate,
		func() ([]*pb.Member, error) { return c.s.membership.UpdateMember(ctx, r.ID, r.PeerURLs) },
		func(h *pb.ResponseHeader, m []*pb.Member) *pb.MemberUpdateResponse {
			return &pb.MemberUpdateResponse{Header: h, Members: m}
		})
}

// MemberPromote makes a running learner a voting member; it campaigns in
// the election from then on. A single node is a voting member.
func (c *clusterServer) MemberPromote(ctx context.Context, r *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	return changeMember(ctx, c.s, r, r.ID, rpctypes.ErrGRPCMemberNotLearner, pb.ClusterClient.MemberPromote,
		func() ([]*pb.Member, error) { return c.s.membership.PromoteMember(ctx, r.ID) },
		func(h *pb.ResponseHeader, m []*pb.Member) *pb.MemberPromoteResponse {
			return &pb.MemberPromoteResponse{Header: h, Members: m}
		})
}

// changeMember serves a change of member id that answers with the members
// after it. A single node answers self when id is its own and etcd's
// member not found for any other; in a cluster the leader runs change
// (onLeader) and answers with the header and the members.
func changeMember[Req, Resp any](ctx context.Context, s *Services, r Req, id uint64, self error,
	forward func(pb.ClusterClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
	change func() ([]*pb.Member, error), answer func(*pb.ResponseHeader, []*pb.Member) Resp) (Resp, error) {
	var none Resp
	if s.membership == nil {
		if id == s.memberID {
			return none, self
		}
		return none, rpctypes.ErrGRPCMemberNotFound
	}
	return onLeader(ctx, s, r, forward, func(role *Role) (Resp, error) {
		members, err := change()
		if err != nil {
			return none, toGRPC(err)
		}
		return answer(s.header(role.Backend.Rev()), members), nil
	})
}

// onLeader runs a member change on the leader: the leader runs local, a
// follower forwards the request, and one that knows no leader answers
// etcd's "no leader".
func onLeader[Req, Resp any](ctx context.Context, s *Services, r Req, forward func(pb.ClusterClient, context.Context, Req, ...grpc.CallOption) (Resp, error), local func(*Role) (Resp, error)) (Resp, error) {
	role := s.current()
	if !role.leading() {
		if role.Leader == nil {
			var none Resp
			return none, rpctypes.ErrGRPCNoLeader
		}
		return forward(pb.NewClusterClient(role.Leader), forwardCtx(ctx), r)
	}
	return local(role)
}

// checkPeerURLs checks URLs as etcd's MemberAdd does (types.NewURLs: a
// scheme of http, https, unix or unixs, and a host:port for the first two),
// and asks for at least one: a member no one can reach could not serve.
func checkPeerURLs(urls []string) error {
	if _, err := types.NewURLs(urls); err != nil || len(urls) == 0 {
		return rpctypes.ErrGRPCMemberBadURLs
	}
	return nil
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
