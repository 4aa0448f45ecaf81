package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"net"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/engramkv/engram/core/internal/clock/fakeclock"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/engines/memkv"
)

// testCA issues certificates for 127.0.0.1 and for named clients.
type testCA struct {
	t    *testing.T
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must0(t, "ca key", err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must0(t, "ca cert", err)
	cert, err := x509.ParseCertificate(der)
	must0(t, "parse ca", err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{t: t, cert: cert, key: key, pool: pool}
}

func (ca *testCA) issue(cn string) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must0(ca.t, "key", err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	must0(ca.t, "serial", err)
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	must0(ca.t, "issue "+cn, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (ca *testCA) clientConn(endpoint, cn string) *grpc.ClientConn {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{ca.issue(cn)}})))
	must0(ca.t, "dial", err)
	ca.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// startTLSMember serves a cluster member over TLS that verifies client
// certificates; it forwards with a certificate of CN "member".
// Its election runs on a Loop view of clk; it returns once the first
// round is over.
func startTLSMember(t *testing.T, ca *testCA, clk *fakeclock.Clock, store kv.Store, name string) (*server.Server, string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must0(t, "listen", err)
	endpoint := l.Addr().String()
	opts := server.Options{
		Store: store, Name: name, Logger: slog.New(slog.DiscardHandler),
		AdvertiseClientURLs: []string{"https://" + endpoint},
		Auth:                server.AuthOptions{BcryptCost: 4},
		Clock:               clk,
		Cluster: server.ClusterOptions{Enabled: true, LeaseDuration: testLease, RenewInterval: testRenew, Clock: clk.Loop(),
			ClientTLS: &tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{ca.issue("member")}}},
	}
	srv, err := server.New(context.Background(), opts)
	must0(t, "start "+name, err)
	serverTLS := &tls.Config{Certificates: []tls.Certificate{ca.issue("server")}, ClientCAs: ca.pool, ClientAuth: tls.VerifyClientCertIfGiven}
	gs := grpc.NewServer(append(server.GRPCServerOptions(opts, serverTLS), srv.Interceptors()...)...)
	srv.Register(gs)
	go func() { _ = gs.Serve(l) }()
	opts.Cluster.Clock.(*fakeclock.Loop).WaitIdle()
	t.Cleanup(func() {
		gs.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return srv, endpoint
}

// TestAuthForwardCertificate: a caller known only by its client
// certificate's CN writes through a follower, which dials the leader with
// its own certificate; before, the leader named the follower's CN.
func TestAuthForwardCertificate(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	shared := memkv.New()
	clk := fakeclock.New(t, clusterStart)
	var srvs []*server.Server
	var eps []string
	for _, name := range []string{"node0", "node1"} {
		s, ep := startTLSMember(t, ca, clk, shared, name)
		srvs, eps = append(srvs, s), append(eps, ep)
	}
	f := -1
	stepUntil(t, clk, "leader and follower", func() bool {
		for i, s := range srvs {
			if l, ok := s.Leader(); ok && !s.IsLeader() && srvs[1-i].IsLeader() && l == []string{"node0", "node1"}[1-i] {
				f = i
			}
		}
		return f >= 0
	})
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	fconn := ca.clientConn(eps[f], "alice")
	fa := pb.NewAuthClient(fconn)
	_, err := fa.UserAdd(ctx, &pb.AuthUserAddRequest{Name: "root", Password: "rp"})
	must0(t, "add root", err)
	_, err = fa.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"})
	must0(t, "grant root", err)
	_, err = fa.UserAdd(ctx, &pb.AuthUserAddRequest{Name: "alice", Options: &authpb.UserAddOptions{NoPassword: true}})
	must0(t, "add alice", err)
	_, err = fa.RoleAdd(ctx, &pb.AuthRoleAddRequest{Name: "r"})
	must0(t, "add r", err)
	_, err = fa.RoleGrantPermission(ctx, &pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: &authpb.Permission{PermType: authpb.READWRITE, Key: []byte("a"), RangeEnd: []byte("b")}})
	must0(t, "grant r", err)
	_, err = fa.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: "alice", Role: "r"})
	must0(t, "grant alice r", err)
	_, err = fa.AuthEnable(ctx, &pb.AuthEnableRequest{})
	must0(t, "enable", err)

	fkv := pb.NewKVClient(fconn)
	_, err = fkv.Put(ctx, &pb.PutRequest{Key: []byte("a1"), Value: []byte("v")})
	must0(t, "certificate-only caller's put through the follower", err)
	_, err = fkv.Put(ctx, &pb.PutRequest{Key: []byte("z"), Value: []byte("v")})
	sameErr(t, "refused put through the follower", err, rpctypes.ErrGRPCPermissionDenied)
}
