package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// authServer reports authentication as disabled and refuses every user and
// role call: Engram authenticates clients with TLS client certificates.
type authServer struct {
	pb.UnimplementedAuthServer
}

var errAuthUnsupported = unimplemented("user/password authentication is not supported; authenticate clients with TLS client certificates (tls.client-ca-file)")

func (authServer) AuthStatus(ctx context.Context, r *pb.AuthStatusRequest) (*pb.AuthStatusResponse, error) {
	return &pb.AuthStatusResponse{Header: &pb.ResponseHeader{}, Enabled: false}, nil
}

func (authServer) Authenticate(context.Context, *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) AuthEnable(context.Context, *pb.AuthEnableRequest) (*pb.AuthEnableResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) AuthDisable(context.Context, *pb.AuthDisableRequest) (*pb.AuthDisableResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserAdd(context.Context, *pb.AuthUserAddRequest) (*pb.AuthUserAddResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserGet(context.Context, *pb.AuthUserGetRequest) (*pb.AuthUserGetResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserList(context.Context, *pb.AuthUserListRequest) (*pb.AuthUserListResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserDelete(context.Context, *pb.AuthUserDeleteRequest) (*pb.AuthUserDeleteResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserChangePassword(context.Context, *pb.AuthUserChangePasswordRequest) (*pb.AuthUserChangePasswordResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserGrantRole(context.Context, *pb.AuthUserGrantRoleRequest) (*pb.AuthUserGrantRoleResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserRevokeRole(context.Context, *pb.AuthUserRevokeRoleRequest) (*pb.AuthUserRevokeRoleResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleAdd(context.Context, *pb.AuthRoleAddRequest) (*pb.AuthRoleAddResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleGet(context.Context, *pb.AuthRoleGetRequest) (*pb.AuthRoleGetResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleList(context.Context, *pb.AuthRoleListRequest) (*pb.AuthRoleListResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleDelete(context.Context, *pb.AuthRoleDeleteRequest) (*pb.AuthRoleDeleteResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleGrantPermission(context.Context, *pb.AuthRoleGrantPermissionRequest) (*pb.AuthRoleGrantPermissionResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleRevokePermission(context.Context, *pb.AuthRoleRevokePermissionRequest) (*pb.AuthRoleRevokePermissionResponse, error) {
	return nil, errAuthUnsupported
}
