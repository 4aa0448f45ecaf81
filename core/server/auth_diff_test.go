package server_test

import (
	"context"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/etcdtest"
)

// authAnswer is a call's answer with the header cleared (IDs, revisions
// and terms are each server's own) and the token dropped (random), or the
// gRPC code and message.
func authAnswer(m proto.Message, err error) string {
	if err != nil {
		s := status.Convert(err)
		return fmt.Sprintf("error %v: %s", s.Code(), s.Message())
	}
	m = proto.Clone(m)
	r := m.ProtoReflect()
	for _, name := range []protoreflect.Name{"header", "token"} {
		if f := r.Descriptor().Fields().ByName(name); f != nil {
			r.Clear(f)
		}
	}
	return prototext.MarshalOptions{}.Format(m)
}

// authStep is one Auth call as a caller ("" for none).
type authStep struct {
	as   string
	call func(context.Context, pb.AuthClient) (proto.Message, error)
}

func step[R proto.Message](as string, f func(context.Context, pb.AuthClient) (R, error)) authStep {
	return authStep{as: as, call: func(ctx context.Context, c pb.AuthClient) (proto.Message, error) { return f(ctx, c) }}
}

// runAuthSteps runs the steps on one server, authenticating as a step's
// caller first (a failed authentication is the step's answer), and
// answers each step's answer.
func runAuthSteps(ctx context.Context, conn *grpc.ClientConn, pw map[string]string, steps []authStep) []string {
	ac := pb.NewAuthClient(conn)
	var out []string
	for _, s := range steps {
		c := ctx
		if s.as != "" {
			tr, err := ac.Authenticate(ctx, &pb.AuthenticateRequest{Name: s.as, Password: pw[s.as]})
			if err != nil {
				out = append(out, "authenticate: "+authAnswer(nil, err))
				continue
			}
			c = withToken(ctx, tr.Token)
		}
		out = append(out, authAnswer(s.call(c, ac)))
	}
	return out
}

// authMgmtSteps is a management sequence with its errors: empty names,
// duplicates, missing users and roles, enable without root or its role,
// authentication good and bad, a non-root user at admin calls and at its
// own data, and root's protections while enabled.
func authMgmtSteps() []authStep {
	add := func(n, p string) authStep {
		return step("", func(ctx context.Context, c pb.AuthClient) (*pb.AuthUserAddResponse, error) {
			return c.UserAdd(ctx, &pb.AuthUserAddRequest{Name: n, Password: p})
		})
	}
	grant := func(as, u, r string) authStep {
		return step(as, func(ctx context.Context, c pb.AuthClient) (*pb.AuthUserGrantRoleResponse, error) {
			return c.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: u, Role: r})
		})
	}
	roleAdd := func(as, r string) authStep {
		return step(as, func(ctx context.Context, c pb.AuthClient) (*pb.AuthRoleAddResponse, error) {
			return c.RoleAdd(ctx, &pb.AuthRoleAddRequest{Name: r})
		})
	}
	perm := func(r string, t authpb.Permission_Type, k, e string) authStep {
		return step("", func(ctx context.Context, c pb.AuthClient) (*pb.AuthRoleGrantPermissionResponse, error) {
			return c.RoleGrantPermission(ctx, &pb.AuthRoleGrantPermissionRequest{Name: r, Perm: &authpb.Permission{PermType: t, Key: []byte(k), RangeEnd: []byte(e)}})
		})
	}
	status := func(as string) authStep {
		return step(as, func(ctx context.Context, c pb.AuthClient) (*pb.AuthStatusResponse, error) {
			return c.AuthStatus(ctx, &pb.AuthStatusRequest{})
		})
	}
	enable := step("", func(ctx context.Context, c pb.AuthClient) (*pb.AuthEnableResponse, error) {
		return c.AuthEnable(ctx, &pb.AuthEnableRequest{})
	})
	userGet := func(as, u string) authStep {
		return step(as, func(ctx context.Context, c pb.AuthClient) (*pb.AuthUserGetResponse, error) {
			return c.UserGet(ctx, &pb.AuthUserGetRequest{Name: u})
		})
	}
	roleGet := func(as, r string) authStep {
		return step(as, func(ctx context.Context, c pb.AuthClient) (*pb.AuthRoleGetResponse, error) {
			return c.RoleGet(ctx, &pb.AuthRoleGetRequest{Role: r})
		})
	}
	return []authStep{
		status(""),
		add("", "x"), roleAdd("", ""), add("u", "up"), add("u", "again"),
		enable,                    // no root user
		add("root", "rp"), enable, // root without its role
		grant("", "nobody", "r"), grant("", "u", "nosuch"), roleAdd("", "r"), roleAdd("", "r"),
		perm("r", authpb.READ, "/a/", "/a0"), perm("r", authpb.READWRITE, "/b", ""), perm("r", authpb.WRITE, "/c", "\x00"),
		perm("r", authpb.WRITE, "/a/", "/a0"), // changes the type of the same range
		perm("r", authpb.READ, "/z", "/a"), perm("nosuch", authpb.READ, "/a", ""),
		step("", func(ctx context.Context, c pb.AuthClient) (*pb.AuthRoleRevokePermissionResponse, error) {
			return c.RoleRevokePermission(ctx, &pb.AuthRoleRevokePermissionRequest{Role: "r", Key: []byte("/q")})
		}),
		step("", func(ctx context.Context, c pb.AuthClient) (*pb.AuthUserRevokeRoleResponse, error) {
			return c.UserRevokeRole(ctx, &pb.AuthUserRevokeRoleRequest{Name: "u", Role: "r"})
		}),
		grant("", "u", "r"), grant("", "u", "r"), grant("", "root", "root"),
		roleGet("", "r"), roleGet("", "root"), roleGet("", "nosuch"), userGet("", "u"), userGet("", "nosuch"),
		status(""), enable, enable, status("root"),
		status(""), status("u"), status("nosuch"),
		userGet("u", "u"), userGet("u", "root"), roleGet("u", "r"), roleGet("u", "root"),
		step("u", func(ctx context.Context, c pb.AuthClient) (*pb.AuthUserListResponse, error) {
			return c.UserList(ctx, &pb.AuthUserListRequest{})
		}),
		grant("u", "u", "root"), roleAdd("u", "r2"), roleAdd("root", "r2"),
		step("root", func(ctx context.Context, c pb.AuthClient) (*pb.AuthUserDeleteResponse, error) {
			return c.UserDelete(ctx, &pb.AuthUserDeleteRequest{Name: "root"})
		}),
		step("root", func(ctx context.Context, c pb.AuthClient) (*pb.AuthUserRevokeRoleResponse, error) {
			return c.UserRevokeRole(ctx, &pb.AuthUserRevokeRoleRequest{Name: "root", Role: "root"})
		}),
		step("root", func(ctx context.Context, c pb.AuthClient) (*pb.AuthRoleDeleteResponse, error) {
			return c.RoleDelete(ctx, &pb.AuthRoleDeleteRequest{Role: "r"})
		}),
		userGet("root", "u"),
		step("root", func(ctx context.Context, c pb.AuthClient) (*pb.AuthUserChangePasswordResponse, error) {
			return c.UserChangePassword(ctx, &pb.AuthUserChangePasswordRequest{Name: "u", Password: "new"})
		}),
		status("u"), // the old password no longer authenticates
		step("root", func(ctx context.Context, c pb.AuthClient) (*pb.AuthenticateResponse, error) {
			return c.Authenticate(ctx, &pb.AuthenticateRequest{Name: "nosuch", Password: "x"})
		}),
		// A certificate-only user: a password for it is etcd's own
		// Unknown error, at login and at a change of password.
		step("root", func(ctx context.Context, c pb.AuthClient) (*pb.AuthUserAddResponse, error) {
			return c.UserAdd(ctx, &pb.AuthUserAddRequest{Name: "cert", Options: &authpb.UserAddOptions{NoPassword: true}})
		}),
		step("root", func(ctx context.Context, c pb.AuthClient) (*pb.AuthenticateResponse, error) {
			return c.Authenticate(ctx, &pb.AuthenticateRequest{Name: "cert", Password: "x"})
		}),
		step("root", func(ctx context.Context, c pb.AuthClient) (*pb.AuthUserChangePasswordResponse, error) {
			return c.UserChangePassword(ctx, &pb.AuthUserChangePasswordRequest{Name: "cert", Password: "x"})
		}),
		userGet("root", "cert"),
		step("root", func(ctx context.Context, c pb.AuthClient) (*pb.AuthRoleListResponse, error) {
			return c.RoleList(ctx, &pb.AuthRoleListRequest{})
		}),
		step("root", func(ctx context.Context, c pb.AuthClient) (*pb.AuthDisableResponse, error) {
			return c.AuthDisable(ctx, &pb.AuthDisableRequest{})
		}),
		status(""),
	}
}

// TestAuthManagementDiff runs the same management sequence against etcd
// 3.6 and Engram and compares every answer, auth revisions included.
func TestAuthManagementDiff(t *testing.T) {
	t.Parallel()
	etcdtest.Require(t)
	e := etcdtest.Start(t, etcdtest.Options{})
	// bcrypt's cost changes no answer, only how long a -race run takes.
	g := servertest.Start(t, memkv.New(), servertest.Options{Auth: server.AuthOptions{BcryptCost: 4}})
	ectx, econn := rawConn(t, e.Endpoint)
	gctx, gconn := rawConn(t, g.Endpoint)
	pw := map[string]string{"u": "up", "root": "rp"}
	steps := authMgmtSteps()
	want, got := runAuthSteps(ectx, econn, pw, steps), runAuthSteps(gctx, gconn, pw, steps)
	for i := range want {
		if want[i] != got[i] {
			t.Errorf("step %d:\n  etcd:   %s\n  engram: %s", i, want[i], got[i])
		}
	}
}
