package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// adminMethods are the calls etcd 3.6 allows only root (membership
// changes: server.go checkMembershipOperationPermission; MoveLeader:
// v3rpc/maintenance.go). Their handlers live in files of other concerns,
// so the check is made around the call (AuthorizeAdminCall) rather than
// by a line in each.
var adminMethods = map[string]bool{
	pb.Cluster_MemberAdd_FullMethodName:      true,
	pb.Cluster_MemberRemove_FullMethodName:   true,
	pb.Cluster_MemberUpdate_FullMethodName:   true,
	pb.Cluster_MemberPromote_FullMethodName:  true,
	pb.Maintenance_MoveLeader_FullMethodName: true,
	pb.Maintenance_Alarm_FullMethodName:      true, // GET is narrowed below
}

// IsAdminMethod reports whether the gRPC method fullMethod is one of the
// calls only root may make while auth is on (AuthorizeAdminCall).
func IsAdminMethod(fullMethod string) bool { return adminMethods[fullMethod] }

// AuthorizeAdminCall refuses req, a call of an admin method
// (IsAdminMethod), to anyone but root while auth is on; an Alarm GET needs
// only a known caller, as in etcd. The server's interceptor calls it, as
// these handlers do not check it themselves.
func (s *Services) AuthorizeAdminCall(ctx context.Context, req any) error {
	if a, ok := req.(*pb.AlarmRequest); ok && a.Action == pb.AlarmRequest_GET {
		return s.authorizeCaller(ctx)
	}
	return s.authorizeAdmin(ctx)
}
