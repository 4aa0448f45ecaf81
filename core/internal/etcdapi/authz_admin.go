package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// adminMethods are the calls etcd 3.6 allows only root (membership
// changes: server.go checkMembershipOperationPermission; MoveLeader:
// v3rpc/maintenance.go). Their handlers live in files of other concerns,
// so the check is an interceptor rather than a line in each.
var adminMethods = map[string]bool{
	pb.Cluster_MemberAdd_FullMethodName:      true,
	pb.Cluster_MemberRemove_FullMethodName:   true,
	pb.Cluster_MemberUpdate_FullMethodName:   true,
	pb.Cluster_MemberPromote_FullMethodName:  true,
	pb.Maintenance_MoveLeader_FullMethodName: true,
	pb.Maintenance_Alarm_FullMethodName:      true, // GET is narrowed below
}

// AdminInterceptor refuses the calls in adminMethods to anyone but root
// while auth is on; an Alarm GET needs only a known caller, as in etcd.
// Install it on the gRPC server with grpc.ChainUnaryInterceptor.
func (s *Services) AdminInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if adminMethods[info.FullMethod] {
			var err error
			if a, ok := req.(*pb.AlarmRequest); ok && a.Action == pb.AlarmRequest_GET {
				err = s.authorizeCaller(ctx)
			} else {
				err = s.authorizeAdmin(ctx)
			}
			if err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
}
