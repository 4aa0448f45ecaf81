package server_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
)

// forwardedCallerHeader is auth.ForwardedCallerHeader (an internal
// package): what a forger would send.
const forwardedCallerHeader = "engram-forwarded-caller"

func sameErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if status.Convert(err).Message() != status.Convert(want).Message() {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

// TestAuthForwardSimpleToken runs two members with etcd's default simple
// tokens, which only the issuing member knows. A user authenticated on the
// follower writes, is refused and watches through it: the follower names
// the caller to the leader with a signed header. A client forging that
// header, to the leader or the follower, is refused.
func TestAuthForwardSimpleToken(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	for _, name := range []string{"node0", "node1"} {
		c.add(name, c.shared, servertest.Options{Auth: server.AuthOptions{BcryptCost: 4}})
	}
	l := c.leader(-1)
	f := 1 - l
	c.following(f, l)
	lctx, lconn := rawConn(t, c.nodes[l].Endpoint)
	fctx, fconn := rawConn(t, c.nodes[f].Endpoint)
	fa := pb.NewAuthClient(fconn)
	_, err := fa.UserAdd(fctx, &pb.AuthUserAddRequest{Name: "root", Password: "rp"})
	must0(t, "add root", err)
	_, err = fa.UserGrantRole(fctx, &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"})
	must0(t, "grant root", err)
	_, err = fa.UserAdd(fctx, &pb.AuthUserAddRequest{Name: "u", Password: "up"})
	must0(t, "add u", err)
	_, err = fa.RoleAdd(fctx, &pb.AuthRoleAddRequest{Name: "r"})
	must0(t, "add r", err)
	_, err = fa.RoleGrantPermission(fctx, &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: &authpb.Permission{PermType: authpb.READWRITE, Key: []byte("a"), RangeEnd: []byte("b")}})
	must0(t, "grant r", err)
	_, err = fa.UserGrantRole(fctx, &pb.AuthUserGrantRoleRequest{User: "u", Role: "r"})
	must0(t, "grant u r", err)
	_, err = fa.AuthEnable(fctx, &pb.AuthEnableRequest{})
	must0(t, "enable", err)

	uctx := withToken(fctx, authenticate(t, fctx, fa, "u", "up"))
	fkv := pb.NewKVClient(fconn)
	_, err = fkv.Put(uctx, &pb.PutRequest{Key: []byte("a1"), Value: []byte("v")})
	must0(t, "allowed put through the follower", err)
	_, err = fkv.Put(uctx, &pb.PutRequest{Key: []byte("z"), Value: []byte("v")})
	sameErr(t, "refused put through the follower", err, rpctypes.ErrGRPCPermissionDenied)
	_, err = fkv.Put(fctx, &pb.PutRequest{Key: []byte("a1"), Value: []byte("v")})
	sameErr(t, "put without a token through the follower", err, rpctypes.ErrGRPCUserEmpty)

	wctx, cancel := context.WithCancel(uctx)
	defer cancel()
	w, err := pb.NewWatchClient(fconn).Watch(wctx)
	must0(t, "open watch through the follower", err)
	must0(t, "send watch create", w.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: []byte("b")}}}))
	created, err := w.Recv()
	must0(t, "watch created", err)
	if !created.Created || created.Canceled {
		t.Fatalf("watch create through the follower: %v", created)
	}
	_, err = fkv.Put(uctx, &pb.PutRequest{Key: []byte("a2"), Value: []byte("w")})
	must0(t, "put a2", err)
	ev, err := w.Recv()
	must0(t, "watch event", err)
	if len(ev.Events) != 1 || string(ev.Events[0].Kv.Key) != "a2" {
		t.Fatalf("watch through the follower got %v", ev)
	}

	// A forged header, straight to the leader or to the follower.
	forged := strings.Join([]string{"cm9vdA", "99", strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10), "AAAA"}, ",")
	for name, ctx := range map[string]context.Context{"leader": lctx, "follower": fctx} {
		conn := lconn
		if name == "follower" {
			conn = fconn
		}
		_, err := pb.NewKVClient(conn).Put(metadata.AppendToOutgoingContext(ctx, forwardedCallerHeader, forged), &pb.PutRequest{Key: []byte("a3"), Value: []byte("x")})
		sameErr(t, "forged caller to the "+name, err, rpctypes.ErrGRPCInvalidAuthToken)
	}
}
