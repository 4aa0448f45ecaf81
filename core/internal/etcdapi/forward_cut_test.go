package etcdapi_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/engramkv/engram/core/internal/etcdapi"
)

// blockingLeader is a leader's KV service whose first Put blocks until its
// caller goes away; later Puts succeed at once.
type blockingLeader struct {
	pb.UnimplementedKVServer
	puts    atomic.Int64
	entered chan struct{}
}

func (l *blockingLeader) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if l.puts.Add(1) == 1 {
		close(l.entered)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &pb.PutResponse{Header: &pb.ResponseHeader{Revision: 2}}, nil
}

func serve(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	register(gs)
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	return l.Addr().String()
}

// TestForwardedWriteCutByLeaderChangeIsNotRetried: a follower that changes
// leader closes its connection to the old one, cancelling the writes it
// was forwarding, which the old leader may have applied. The client must
// get an answer it does not resend the write on ("leader changed"): a
// Canceled answer made clientv3 send it again, and the linearizability
// check (tests/linearizability) recorded a Put applied at two revisions.
func TestForwardedWriteCutByLeaderChangeIsNotRetried(t *testing.T) {
	leader := &blockingLeader{entered: make(chan struct{})}
	leaderAddr := serve(t, func(gs *grpc.Server) { pb.RegisterKVServer(gs, leader) })
	dial := func() *grpc.ClientConn {
		conn, err := grpc.NewClient(leaderAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	old := dial()
	follower := etcdapi.New(etcdapi.Options{Role: &etcdapi.Role{Leader: old, LeaderID: 1}, Name: "follower"})
	followerAddr := serve(t, follower.Register)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{followerAddr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := cli.Put(ctx, "k", "v")
		errc <- err
	}()
	select {
	case <-leader.entered:
	case <-ctx.Done():
		t.Fatal("the forwarded Put never reached the leader")
	}
	// What followLeader does when the election names another leader (here
	// the same address, so a resent write would reach it again).
	follower.SetRole(&etcdapi.Role{Leader: dial(), LeaderID: 2})
	_ = old.Close()

	err = <-errc
	if n := leader.puts.Load(); n != 1 {
		t.Fatalf("the write reached the leader %d times (client error: %v)", n, err)
	}
	if !errors.Is(rpctypes.Error(err), rpctypes.ErrLeaderChanged) {
		t.Fatalf("client error %v, want %v", err, rpctypes.ErrLeaderChanged)
	}
}
