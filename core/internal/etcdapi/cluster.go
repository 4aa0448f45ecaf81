package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

type clusterServer struct {
	pb.UnimplementedClusterServer
	s *Services
}

func (c *clusterServer) MemberList(ctx context.Context, r *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	members := []*pb.Member{{ID: c.s.memberID, Name: c.s.name, ClientURLs: c.s.urls}}
	if c.s.members != nil {
		var err error
		if members, err = c.s.members(ctx); err != nil {
			return nil, toGRPC(err)
		}
	}
	return &pb.MemberListResponse{Header: c.s.header(c.s.current().Backend.Rev()), Members: members}, nil
}

func (c *clusterServer) MemberAdd(context.Context, *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	return nil, unimplemented("member changes are not supported: Engram members share one storage engine and need no membership")
}

func (c *clusterServer) MemberRemove(context.Context, *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	return nil, unimplemented("member changes are not supported: Engram members share one storage engine and need no membership")
}

func (c *clusterServer) MemberUpdate(context.Context, *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	return nil, unimplemented("member changes are not supported: Engram members share one storage engine and need no membership")
}

func (c *clusterServer) MemberPromote(context.Context, *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	return nil, unimplemented("member changes are not supported: Engram members share one storage engine and need no membership")
}

func (m *maintenanceServer) MoveLeader(ctx context.Context, r *pb.MoveLeaderRequest) (*pb.MoveLeaderResponse, error) {
	return nil, unimplemented("move-leader is not supported")
}
