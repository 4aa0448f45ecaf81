package server_test

import (
	"context"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/internal/etcdtest"
)

// authPermSetup makes root and a user "u" who may read the "/a/" prefix
// and read and write "/b", turns auth on, and answers a token per user.
func authPermSetup(t *testing.T, ctx context.Context, conn *grpc.ClientConn) map[string]string {
	t.Helper()
	ac := pb.NewAuthClient(conn)
	steps := []func(context.Context) error{
		func(ctx context.Context) error {
			_, err := ac.UserAdd(ctx, &pb.AuthUserAddRequest{Name: "root", Password: "rp"})
			return err
		},
		func(ctx context.Context) error {
			_, err := ac.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"})
			return err
		},
		func(ctx context.Context) error {
			_, err := ac.UserAdd(ctx, &pb.AuthUserAddRequest{Name: "u", Password: "up"})
			return err
		},
		func(ctx context.Context) error {
			_, err := ac.RoleAdd(ctx, &pb.AuthRoleAddRequest{Name: "r"})
			return err
		},
		func(ctx context.Context) error {
			_, err := ac.RoleGrantPermission(ctx, &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: &authpb.Permission{PermType: authpb.READ, Key: []byte("/a/"), RangeEnd: []byte("/a0")}})
			return err
		},
		func(ctx context.Context) error {
			_, err := ac.RoleGrantPermission(ctx, &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: &authpb.Permission{PermType: authpb.READWRITE, Key: []byte("/b")}})
			return err
		},
		func(ctx context.Context) error {
			_, err := ac.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: "u", Role: "r"})
			return err
		},
		func(ctx context.Context) error { _, err := ac.AuthEnable(ctx, &pb.AuthEnableRequest{}); return err },
	}
	for i, step := range steps {
		if err := step(ctx); err != nil {
			t.Fatalf("auth setup step %d: %v", i, err)
		}
	}
	tokens := map[string]string{"": "", "garbage": "garbage.token"}
	for user, pw := range map[string]string{"root": "rp", "u": "up"} {
		resp, err := ac.Authenticate(ctx, &pb.AuthenticateRequest{Name: user, Password: pw})
		if err != nil {
			t.Fatalf("authenticate %s: %v", user, err)
		}
		tokens[user] = resp.Token
	}
	return tokens
}

func withToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "token", token)
}

// authPermAnswers sends each request shape as each caller and records
// the answer: "ok" or the gRPC code and message. The same function is
// meant to run against Engram once its auth state serves the Auth calls.
func authPermAnswers(t *testing.T, ctx context.Context, conn *grpc.ClientConn, tokens map[string]string) map[string]string {
	t.Helper()
	kvc, lc, mc := pb.NewKVClient(conn), pb.NewLeaseClient(conn), pb.NewMaintenanceClient(conn)
	root := withToken(ctx, tokens["root"])
	lease, err := lc.LeaseGrant(root, &pb.LeaseGrantRequest{TTL: 600})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvc.Put(root, &pb.PutRequest{Key: []byte("/c"), Lease: lease.ID}); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(context.Context) error{
		"range /a/x": func(c context.Context) error {
			_, err := kvc.Range(c, &pb.RangeRequest{Key: []byte("/a/x")})
			return err
		},
		"range /c": func(c context.Context) error { _, err := kvc.Range(c, &pb.RangeRequest{Key: []byte("/c")}); return err },
		"put /b":   func(c context.Context) error { _, err := kvc.Put(c, &pb.PutRequest{Key: []byte("/b")}); return err },
		"put /a/x": func(c context.Context) error { _, err := kvc.Put(c, &pb.PutRequest{Key: []byte("/a/x")}); return err },
		"put /b on lease": func(c context.Context) error {
			_, err := kvc.Put(c, &pb.PutRequest{Key: []byte("/b"), Lease: lease.ID})
			return err
		},
		"delete /a/x": func(c context.Context) error {
			_, err := kvc.DeleteRange(c, &pb.DeleteRangeRequest{Key: []byte("/a/x")})
			return err
		},
		"delete /b prev_kv": func(c context.Context) error {
			_, err := kvc.DeleteRange(c, &pb.DeleteRangeRequest{Key: []byte("/b"), PrevKv: true})
			return err
		},
		"txn refused op in nested failure only": func(c context.Context) error {
			_, err := kvc.Txn(c, &pb.TxnRequest{Success: []*pb.RequestOp{opPut("/b", "v")}, Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Failure: []*pb.RequestOp{opPut("/a/x", "v")}}}}}})
			return err
		},
		"txn allowed": func(c context.Context) error {
			_, err := kvc.Txn(c, &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("/a/x")}}, Success: []*pb.RequestOp{opRange("/a/y", "", 0)}, Failure: []*pb.RequestOp{opPut("/b", "v")}})
			return err
		},
		"lease ttl keys": func(c context.Context) error {
			_, err := lc.LeaseTimeToLive(c, &pb.LeaseTimeToLiveRequest{ID: lease.ID, Keys: true})
			return err
		},
		"compact": func(c context.Context) error {
			_, err := kvc.Compact(c, &pb.CompactionRequest{Revision: 1})
			return err
		},
		"status":     func(c context.Context) error { _, err := mc.Status(c, &pb.StatusRequest{}); return err },
		"hashkv":     func(c context.Context) error { _, err := mc.HashKV(c, &pb.HashKVRequest{}); return err },
		"defragment": func(c context.Context) error { _, err := mc.Defragment(c, &pb.DefragmentRequest{}); return err },
	}
	got := map[string]string{}
	for _, caller := range []string{"u", "", "garbage"} {
		for name, call := range calls {
			a := "ok"
			if err := call(withToken(ctx, tokens[caller])); err != nil {
				s := status.Convert(err)
				a = fmt.Sprintf("%v: %s", s.Code(), s.Message())
			}
			got[caller+"|"+name] = a
		}
	}
	return got
}

// TestAuthPermEtcdOracle pins etcd 3.6's answers that the etcdapi walk
// (authz.go, TestAuthorizeWalk) reproduces.
func TestAuthPermEtcdOracle(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t, etcdtest.Options{})
	ctx, conn := rawConn(t, e.Endpoint)
	got := authPermAnswers(t, ctx, conn, authPermSetup(t, ctx, conn))
	const denied, empty, bad = "PermissionDenied: etcdserver: permission denied", "InvalidArgument: etcdserver: user name is empty", "Unauthenticated: etcdserver: invalid auth token"
	want := map[string]string{
		"u|range /a/x": "ok", "u|range /c": denied, "u|put /b": "ok", "u|put /a/x": denied,
		"u|put /b on lease": denied, "u|delete /a/x": denied, "u|delete /b prev_kv": "ok",
		"u|txn refused op in nested failure only": denied, "u|txn allowed": "ok",
		"u|lease ttl keys": denied, "u|compact": denied, "u|status": "ok", "u|hashkv": denied, "u|defragment": denied,
		"|range /a/x": empty, "|put /b": empty, "|status": empty, "|hashkv": empty, "|compact": empty,
		"garbage|range /a/x": bad, "garbage|put /b": bad, "garbage|status": bad, "garbage|compact": bad,
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: etcd answers %q, want %q", k, got[k], w)
		}
	}
}

// watchCreateAnswer opens a watch stream as token and answers the first
// response to a create on key: etcd refuses for auth as created and
// canceled at once, under ID -1, with the gRPC error's full text.
func watchCreateAnswer(t *testing.T, ctx context.Context, conn *grpc.ClientConn, token, key string) *pb.WatchResponse {
	t.Helper()
	ctx, cancel := context.WithCancel(withToken(ctx, token))
	defer cancel()
	ws, err := pb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte(key)}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := ws.Recv()
	if err != nil {
		t.Fatal(err)
	}
	resp.Header = nil
	return resp
}

func TestAuthPermEtcdWatchOracle(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t, etcdtest.Options{})
	ctx, conn := rawConn(t, e.Endpoint)
	tokens := authPermSetup(t, ctx, conn)
	for _, tc := range []struct{ caller, key, reason string }{
		{"u", "/c", "rpc error: code = PermissionDenied desc = etcdserver: permission denied"},
		{"", "/a/x", "rpc error: code = InvalidArgument desc = etcdserver: user name is empty"},
		{"garbage", "/a/x", "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"},
	} {
		got := watchCreateAnswer(t, ctx, conn, tokens[tc.caller], tc.key)
		if !got.Created || !got.Canceled || got.WatchId != -1 || got.CancelReason != tc.reason {
			t.Errorf("%q watch %s: etcd answers %v", tc.caller, tc.key, got)
		}
	}
	if got := watchCreateAnswer(t, ctx, conn, tokens["u"], "/a/x"); !got.Created || got.Canceled {
		t.Errorf("allowed watch: %v", got)
	}
}
