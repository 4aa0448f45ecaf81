package etcdapi

import (
	"context"
	"encoding/base64"

	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"

	"github.com/engramkv/engram/core/internal/auth"
)

// authServer is etcd's Auth service over the auth state. Every call but
// Authenticate needs root while auth is on (etcd 3.6's
// apply/apply_auth.go needAdminPermission), except that a user may read
// itself and the roles it holds. Changes are written by the leader with
// its fence; a follower checks the caller, then forwards them.
type authServer struct {
	pb.UnimplementedAuthServer
	s *Services
}

// store is the auth state, or nil when this server was built without one
// (then every call answers as etcd does with auth never enabled).
func (a *authServer) store() *auth.Store {
	st, _ := a.s.auth.(*auth.Store)
	return st
}

var errNoAuthState = unimplemented("this server has no auth state")

// adminStore returns the auth state for a change only an admin may make:
// errNoAuthState on a server without one, else the caller's refusal, if
// any.
func (a *authServer) adminStore(ctx context.Context) (*auth.Store, error) {
	st := a.store()
	if st == nil {
		return nil, errNoAuthState
	}
	if err := a.s.authorizeAdmin(ctx); err != nil {
		return nil, err
	}
	return st, nil
}

// change runs one mutation on the leader, or forwards it.
func change[Req, Resp any](ctx context.Context, a *authServer, r Req, c auth.Change,
	call func(pb.AuthClient, context.Context, Req, ...grpc.CallOption) (Resp, error), ok Resp) (Resp, error) {
	var none Resp
	st, err := a.adminStore(ctx)
	if err != nil {
		return none, err
	}
	role := a.s.current()
	if !role.leading() {
		resp, err := forward(ctx, role, pb.NewAuthClient, call, r)
		if err == nil {
			// The caller reads its own change here next, so do not wait
			// for the poll to bring it.
			if rerr := st.Reload(ctx); rerr != nil {
				a.s.log.Warn("reload auth state after a forwarded change", "err", rerr)
			}
		}
		return resp, err
	}
	if err := st.Mutate(ctx, role.Backend.CommitMeta, c); err != nil {
		return none, toGRPC(err)
	}
	return ok, nil
}

func (a *authServer) hdr() *pb.ResponseHeader { return a.s.header(a.s.current().Backend.Rev()) }

func (a *authServer) AuthEnable(ctx context.Context, r *pb.AuthEnableRequest) (*pb.AuthEnableResponse, error) {
	return change(ctx, a, r, auth.Enable, pb.AuthClient.AuthEnable, &pb.AuthEnableResponse{Header: a.hdr()})
}

func (a *authServer) AuthDisable(ctx context.Context, r *pb.AuthDisableRequest) (*pb.AuthDisableResponse, error) {
	return change(ctx, a, r, auth.Disable, pb.AuthClient.AuthDisable, &pb.AuthDisableResponse{Header: a.hdr()})
}

func (a *authServer) AuthStatus(ctx context.Context, r *pb.AuthStatusRequest) (*pb.AuthStatusResponse, error) {
	st := a.store()
	if st == nil {
		return &pb.AuthStatusResponse{Header: a.hdr()}, nil
	}
	if err := a.s.authorizeAdmin(ctx); err != nil {
		return nil, err
	}
	return &pb.AuthStatusResponse{Header: a.hdr(), Enabled: st.Enabled(), AuthRevision: st.Revision()}, nil
}

func (a *authServer) Authenticate(ctx context.Context, r *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	st := a.store()
	if st == nil {
		return nil, rpctypes.ErrGRPCAuthNotEnabled
	}
	tok, err := st.Authenticate(ctx, r.Name, r.Password)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.AuthenticateResponse{Header: a.hdr(), Token: tok}, nil
}

func (a *authServer) UserAdd(ctx context.Context, r *pb.AuthUserAddRequest) (*pb.AuthUserAddResponse, error) {
	// Checked here too so a caller who may not add users costs no bcrypt.
	st, err := a.adminStore(ctx)
	if err != nil {
		return nil, err
	}
	noPassword := r.Options != nil && r.Options.NoPassword
	var hash []byte
	if !noPassword {
		// The follower hashes, as etcd's API layer does, and forwards the
		// hash, so the leader spends no bcrypt time and the password never
		// travels further than the member it was sent to.
		if hash, err = passwordHash(st, r.Password, r.HashedPassword); err != nil {
			return nil, err
		}
		r = &pb.AuthUserAddRequest{Name: r.Name, HashedPassword: base64.StdEncoding.EncodeToString(hash), Options: r.Options}
	}
	return change(ctx, a, r, auth.AddUser(r.Name, hash, noPassword), pb.AuthClient.UserAdd, &pb.AuthUserAddResponse{Header: a.hdr()})
}

func (a *authServer) UserChangePassword(ctx context.Context, r *pb.AuthUserChangePasswordRequest) (*pb.AuthUserChangePasswordResponse, error) {
	st, err := a.adminStore(ctx)
	if err != nil {
		return nil, err
	}
	hash, err := passwordHash(st, r.Password, r.HashedPassword)
	if err != nil {
		return nil, err
	}
	r = &pb.AuthUserChangePasswordRequest{Name: r.Name, HashedPassword: base64.StdEncoding.EncodeToString(hash)}
	return change(ctx, a, r, auth.ChangePassword(r.Name, hash), pb.AuthClient.UserChangePassword, &pb.AuthUserChangePasswordResponse{Header: a.hdr()})
}

// passwordHash is the hash a request names, or one made of its password.
func passwordHash(st *auth.Store, password, hashed string) ([]byte, error) {
	if hashed != "" {
		h, err := base64.StdEncoding.DecodeString(hashed)
		if err != nil {
			return nil, rpctypes.ErrGRPCAuthFailed
		}
		return h, nil
	}
	h, err := st.Hash(password)
	if err != nil {
		return nil, toGRPC(err)
	}
	return h, nil
}

func (a *authServer) UserDelete(ctx context.Context, r *pb.AuthUserDeleteRequest) (*pb.AuthUserDeleteResponse, error) {
	return change(ctx, a, r, auth.DeleteUser(r.Name), pb.AuthClient.UserDelete, &pb.AuthUserDeleteResponse{Header: a.hdr()})
}

func (a *authServer) UserGrantRole(ctx context.Context, r *pb.AuthUserGrantRoleRequest) (*pb.AuthUserGrantRoleResponse, error) {
	return change(ctx, a, r, auth.GrantRole(r.User, r.Role), pb.AuthClient.UserGrantRole, &pb.AuthUserGrantRoleResponse{Header: a.hdr()})
}

func (a *authServer) UserRevokeRole(ctx context.Context, r *pb.AuthUserRevokeRoleRequest) (*pb.AuthUserRevokeRoleResponse, error) {
	return change(ctx, a, r, auth.RevokeRole(r.Name, r.Role), pb.AuthClient.UserRevokeRole, &pb.AuthUserRevokeRoleResponse{Header: a.hdr()})
}

func (a *authServer) RoleAdd(ctx context.Context, r *pb.AuthRoleAddRequest) (*pb.AuthRoleAddResponse, error) {
	return change(ctx, a, r, auth.AddRole(r.Name), pb.AuthClient.RoleAdd, &pb.AuthRoleAddResponse{Header: a.hdr()})
}

func (a *authServer) RoleDelete(ctx context.Context, r *pb.AuthRoleDeleteRequest) (*pb.AuthRoleDeleteResponse, error) {
	return change(ctx, a, r, auth.DeleteRole(r.Role), pb.AuthClient.RoleDelete, &pb.AuthRoleDeleteResponse{Header: a.hdr()})
}

func (a *authServer) RoleGrantPermission(ctx context.Context, r *pb.AuthRoleGrantPermissionRequest) (*pb.AuthRoleGrantPermissionResponse, error) {
	return change(ctx, a, r, auth.GrantPermission(r.Name, r.Perm), pb.AuthClient.RoleGrantPermission, &pb.AuthRoleGrantPermissionResponse{Header: a.hdr()})
}

func (a *authServer) RoleRevokePermission(ctx context.Context, r *pb.AuthRoleRevokePermissionRequest) (*pb.AuthRoleRevokePermissionResponse, error) {
	return change(ctx, a, r, auth.RevokePermission(r.Role, r.Key, r.RangeEnd), pb.AuthClient.RoleRevokePermission, &pb.AuthRoleRevokePermissionResponse{Header: a.hdr()})
}

// selfOr lets a caller through who is root or for whom self holds.
func (a *authServer) selfOr(ctx context.Context, self func(*auth.Info) bool) error {
	err := a.s.authorizeAdmin(ctx)
	if err == nil {
		return nil
	}
	ai, cerr := a.s.auth.Caller(ctx)
	if cerr == nil && ai != nil && self(ai) {
		return nil
	}
	return err
}

func (a *authServer) UserGet(ctx context.Context, r *pb.AuthUserGetRequest) (*pb.AuthUserGetResponse, error) {
	st := a.store()
	if st == nil {
		return nil, rpctypes.ErrGRPCUserNotFound
	}
	if err := a.selfOr(ctx, func(ai *auth.Info) bool { return ai.Username == r.Name }); err != nil {
		return nil, err
	}
	u := st.User(r.Name)
	if u == nil {
		return nil, rpctypes.ErrGRPCUserNotFound
	}
	return &pb.AuthUserGetResponse{Header: a.hdr(), Roles: u.Roles}, nil
}

// adminList lists what only an admin may list (users or roles); a server
// that has no auth state yet has none to list.
func (a *authServer) adminList(ctx context.Context, list func(*auth.Store) []string) ([]string, error) {
	st := a.store()
	if st == nil {
		return nil, nil
	}
	if err := a.s.authorizeAdmin(ctx); err != nil {
		return nil, err
	}
	return list(st), nil
}

func (a *authServer) UserList(ctx context.Context, r *pb.AuthUserListRequest) (*pb.AuthUserListResponse, error) {
	names, err := a.adminList(ctx, (*auth.Store).Users)
	if err != nil {
		return nil, err
	}
	return &pb.AuthUserListResponse{Header: a.hdr(), Users: names}, nil
}

func (a *authServer) RoleGet(ctx context.Context, r *pb.AuthRoleGetRequest) (*pb.AuthRoleGetResponse, error) {
	st := a.store()
	if st == nil {
		return nil, rpctypes.ErrGRPCRoleNotFound
	}
	if err := a.selfOr(ctx, func(ai *auth.Info) bool { return st.HasRole(ai.Username, r.Role) }); err != nil {
		return nil, err
	}
	resp := &pb.AuthRoleGetResponse{Header: a.hdr()}
	role := st.Role(r.Role)
	if role == nil {
		return nil, rpctypes.ErrGRPCRoleNotFound
	}
	if r.Role == auth.RootRole {
		// etcd answers the root role's implicit permission over every key.
		resp.Perm = []*authpb.Permission{{PermType: authpb.READWRITE, Key: []byte{}, RangeEnd: []byte{0}}}
		return resp, nil
	}
	for _, p := range role.Perms {
		resp.Perm = append(resp.Perm, &authpb.Permission{PermType: p.Type, Key: p.Key, RangeEnd: p.RangeEnd})
	}
	return resp, nil
}

func (a *authServer) RoleList(ctx context.Context, r *pb.AuthRoleListRequest) (*pb.AuthRoleListResponse, error) {
	names, err := a.adminList(ctx, (*auth.Store).Roles)
	if err != nil {
		return nil, err
	}
	return &pb.AuthRoleListResponse{Header: a.hdr(), Roles: names}, nil
}
