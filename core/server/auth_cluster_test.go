package server_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/badger"
)

// jwtSpec writes a fresh RSA key pair and answers the --auth-token value
// naming it.
func jwtSpec(t *testing.T) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return "jwt,pub-key=" + write("pub.pem", "PUBLIC KEY", pub) + ",priv-key=" + write("priv.pem", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)) + ",sign-method=RS256,ttl=10m"
}

func authenticate(t *testing.T, ctx context.Context, ac pb.AuthClient, user, pw string) string {
	t.Helper()
	r, err := ac.Authenticate(ctx, &pb.AuthenticateRequest{Name: user, Password: pw})
	if err != nil {
		t.Fatalf("authenticate %s: %v", user, err)
	}
	return r.Token
}

func must0(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestAuthClusterJWT runs two members over one store with JWT tokens:
// changes sent to the follower are forwarded to the leader and visible on
// the follower at once, a token from either member works on the other, and
// a token naming a newer auth revision than the follower holds makes it
// catch up rather than refuse.
func TestAuthClusterJWT(t *testing.T) {
	t.Parallel()
	spec := jwtSpec(t)
	c := newCluster(t)
	for _, name := range []string{"node0", "node1"} {
		c.add(name, c.shared, servertest.Options{Auth: server.AuthOptions{Token: spec, BcryptCost: 4}})
	}
	nodes := c.nodes
	l := c.leader(-1)
	f := 1 - l
	c.following(f, l)
	lctx, lconn := rawConn(t, nodes[l].Endpoint)
	fctx, fconn := rawConn(t, nodes[f].Endpoint)
	la, fa := pb.NewAuthClient(lconn), pb.NewAuthClient(fconn)

	_, err := fa.UserAdd(fctx, &pb.AuthUserAddRequest{Name: "root", Password: "rp"})
	must0(t, "user add on follower", err)
	_, err = fa.UserGrantRole(fctx, &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"})
	must0(t, "grant root on follower", err)
	_, err = fa.UserAdd(fctx, &pb.AuthUserAddRequest{Name: "u", Password: "up"})
	must0(t, "user add u on follower", err)
	_, err = fa.AuthEnable(fctx, &pb.AuthEnableRequest{})
	must0(t, "enable on follower", err)

	// The leader wrote what the follower forwarded.
	rootL := authenticate(t, lctx, la, "root", "rp")
	users, err := la.UserList(withToken(lctx, rootL), &pb.AuthUserListRequest{})
	must0(t, "user list on leader", err)
	if len(users.Users) != 2 {
		t.Fatalf("leader lists %v", users.Users)
	}
	// A follower's token on the leader, and the leader's on the follower.
	uF := authenticate(t, fctx, fa, "u", "up")
	_, err = la.UserGet(withToken(lctx, uF), &pb.AuthUserGetRequest{Name: "u"})
	must0(t, "follower's token on leader", err)
	_, err = fa.RoleAdd(withToken(fctx, rootL), &pb.AuthRoleAddRequest{Name: "r"})
	must0(t, "leader's token on follower, forwarded", err)

	// A change made on the leader: its token names a revision the
	// follower may not hold yet; the follower catches up on sight.
	_, err = la.UserAdd(withToken(lctx, rootL), &pb.AuthUserAddRequest{Name: "v", Password: "vp"})
	must0(t, "user add v on leader", err)
	vL := authenticate(t, lctx, la, "v", "vp")
	_, err = fa.UserGet(withToken(fctx, vL), &pb.AuthUserGetRequest{Name: "v"})
	must0(t, "new user's token on follower", err)
	authenticate(t, fctx, fa, "v", "vp")

	// The root token from before the change is old now, on both.
	_, err = fa.UserList(withToken(fctx, rootL), &pb.AuthUserListRequest{})
	must0(t, "admin call with the old root token (etcd checks no revision for admin calls)", err)
	kv := pb.NewKVClient(fconn)
	if _, err := kv.Range(withToken(fctx, rootL), &pb.RangeRequest{Key: []byte("k")}); status.Convert(err).Message() != status.Convert(rpctypes.ErrGRPCAuthOldRevision).Message() {
		t.Fatalf("range with a token from before a change: %v, want %v", err, rpctypes.ErrGRPCAuthOldRevision)
	}
}

// TestAuthRestartBadger: users, roles, grants and the enabled switch of a
// badger-backed server survive a restart.
func TestAuthRestartBadger(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	{
		bs, err := badger.Open(badger.Options{Dir: dir})
		must0(t, "open badger", err)
		srv := servertest.Start(t, bs, servertest.Options{Auth: server.AuthOptions{BcryptCost: 4}})
		ctx, conn := rawConn(t, srv.Endpoint)
		ac := pb.NewAuthClient(conn)
		_, err = ac.UserAdd(ctx, &pb.AuthUserAddRequest{Name: "root", Password: "rp"})
		must0(t, "user add", err)
		_, err = ac.RoleAdd(ctx, &pb.AuthRoleAddRequest{Name: "r"})
		must0(t, "role add", err)
		_, err = ac.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"})
		must0(t, "grant", err)
		_, err = ac.AuthEnable(ctx, &pb.AuthEnableRequest{})
		must0(t, "enable", err)
		srv.Stop()
		must0(t, "close badger", bs.Close())
	}
	bs, err := badger.Open(badger.Options{Dir: dir})
	must0(t, "reopen badger", err)
	t.Cleanup(func() { _ = bs.Close() })
	srv := servertest.Start(t, bs, servertest.Options{})
	ctx, conn := rawConn(t, srv.Endpoint)
	ac := pb.NewAuthClient(conn)
	if _, err := ac.RoleList(ctx, &pb.AuthRoleListRequest{}); status.Convert(err).Message() != status.Convert(rpctypes.ErrGRPCUserEmpty).Message() {
		t.Fatalf("role list without a token after restart: %v, want auth still on", err)
	}
	tok := authenticate(t, ctx, ac, "root", "rp")
	roles, err := ac.RoleList(withToken(ctx, tok), &pb.AuthRoleListRequest{})
	must0(t, "role list", err)
	st, err := ac.AuthStatus(withToken(ctx, tok), &pb.AuthStatusRequest{})
	must0(t, "status", err)
	if len(roles.Roles) != 1 || roles.Roles[0] != "r" || !st.Enabled {
		t.Fatalf("after restart: roles %v, status %v", roles.Roles, st)
	}
}
