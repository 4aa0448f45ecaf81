package etcdapi_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/engramkv/engram/core/internal/etcdapi"
)

// callerKey is metadata a client sends to a follower; the leader must see it
// (clientv3 sends "hasleader" this way).
const callerKey = "engram-test-caller"

// recordingLeader is a leader's KV, Lease and Watch services that record
// which method a forwarded call reached and with what caller metadata.
// Compact answers the leader's own error, which the follower must pass on.
type recordingLeader struct {
	pb.UnimplementedKVServer
	pb.UnimplementedLeaseServer
	pb.UnimplementedWatchServer
	mu    sync.Mutex
	calls []string
}

func (l *recordingLeader) record(ctx context.Context, method string) *pb.ResponseHeader {
	md, _ := metadata.FromIncomingContext(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, method+" from "+first(md.Get(callerKey)))
	return &pb.ResponseHeader{Revision: int64(len(l.calls))}
}

func (l *recordingLeader) lastCall() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.calls) == 0 {
		return ""
	}
	return l.calls[len(l.calls)-1]
}

func first(vs []string) string {
	if len(vs) == 0 {
		return "(no metadata)"
	}
	return vs[0]
}

func (l *recordingLeader) Put(ctx context.Context, _ *pb.PutRequest) (*pb.PutResponse, error) {
	return &pb.PutResponse{Header: l.record(ctx, "Put")}, nil
}

func (l *recordingLeader) DeleteRange(ctx context.Context, _ *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	return &pb.DeleteRangeResponse{Header: l.record(ctx, "DeleteRange")}, nil
}

func (l *recordingLeader) Txn(ctx context.Context, _ *pb.TxnRequest) (*pb.TxnResponse, error) {
	return &pb.TxnResponse{Header: l.record(ctx, "Txn")}, nil
}

func (l *recordingLeader) Compact(ctx context.Context, _ *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	l.record(ctx, "Compact")
	return nil, rpctypes.ErrGRPCCompacted
}

func (l *recordingLeader) LeaseGrant(ctx context.Context, _ *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	return &pb.LeaseGrantResponse{Header: l.record(ctx, "LeaseGrant")}, nil
}

func (l *recordingLeader) LeaseRevoke(ctx context.Context, _ *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	return &pb.LeaseRevokeResponse{Header: l.record(ctx, "LeaseRevoke")}, nil
}

func (l *recordingLeader) LeaseTimeToLive(ctx context.Context, _ *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	return &pb.LeaseTimeToLiveResponse{Header: l.record(ctx, "LeaseTimeToLive")}, nil
}

func (l *recordingLeader) LeaseLeases(ctx context.Context, _ *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	return &pb.LeaseLeasesResponse{Header: l.record(ctx, "LeaseLeases")}, nil
}

// LeaseKeepAlive answers each request with its lease ID.
func (l *recordingLeader) LeaseKeepAlive(stream pb.Lease_LeaseKeepAliveServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		h := l.record(stream.Context(), "LeaseKeepAlive")
		if err := stream.Send(&pb.LeaseKeepAliveResponse{Header: h, ID: req.ID}); err != nil {
			return err
		}
	}
}

// Watch answers each create request with one event on its key.
func (l *recordingLeader) Watch(stream pb.Watch_WatchServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		h := l.record(stream.Context(), "Watch")
		key := req.GetCreateRequest().GetKey()
		if err := stream.Send(&pb.WatchResponse{Header: h, Events: []*mvccpb.Event{{Kv: &mvccpb.KeyValue{Key: key}}}}); err != nil {
			return err
		}
	}
}

func dialFollower(t *testing.T, role *etcdapi.Role) *grpc.ClientConn {
	t.Helper()
	follower := etcdapi.New(etcdapi.Options{Role: role, Name: "follower"})
	conn, err := grpc.NewClient(serve(t, follower.Register), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// leaderOnlyCalls are the unary calls a follower cannot serve, each made
// through conn and answering the revision of its response header.
var leaderOnlyCalls = []struct {
	method string
	call   func(context.Context, *grpc.ClientConn) (*pb.ResponseHeader, error)
}{
	{"Put", func(ctx context.Context, c *grpc.ClientConn) (*pb.ResponseHeader, error) {
		r, err := pb.NewKVClient(c).Put(ctx, &pb.PutRequest{Key: []byte("k")})
		return r.GetHeader(), err
	}},
	{"DeleteRange", func(ctx context.Context, c *grpc.ClientConn) (*pb.ResponseHeader, error) {
		r, err := pb.NewKVClient(c).DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("k")})
		return r.GetHeader(), err
	}},
	{"Txn", func(ctx context.Context, c *grpc.ClientConn) (*pb.ResponseHeader, error) {
		r, err := pb.NewKVClient(c).Txn(ctx, &pb.TxnRequest{})
		return r.GetHeader(), err
	}},
	{"Compact", func(ctx context.Context, c *grpc.ClientConn) (*pb.ResponseHeader, error) {
		r, err := pb.NewKVClient(c).Compact(ctx, &pb.CompactionRequest{Revision: 1})
		return r.GetHeader(), err
	}},
	{"LeaseGrant", func(ctx context.Context, c *grpc.ClientConn) (*pb.ResponseHeader, error) {
		r, err := pb.NewLeaseClient(c).LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
		return r.GetHeader(), err
	}},
	{"LeaseRevoke", func(ctx context.Context, c *grpc.ClientConn) (*pb.ResponseHeader, error) {
		r, err := pb.NewLeaseClient(c).LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: 1})
		return r.GetHeader(), err
	}},
	{"LeaseTimeToLive", func(ctx context.Context, c *grpc.ClientConn) (*pb.ResponseHeader, error) {
		r, err := pb.NewLeaseClient(c).LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: 1})
		return r.GetHeader(), err
	}},
	{"LeaseLeases", func(ctx context.Context, c *grpc.ClientConn) (*pb.ResponseHeader, error) {
		r, err := pb.NewLeaseClient(c).LeaseLeases(ctx, &pb.LeaseLeasesRequest{})
		return r.GetHeader(), err
	}},
}

// TestFollowerForwardsLeaderOnlyCalls: each call a follower cannot serve
// reaches the same method on the leader, with the caller's metadata, and
// the caller gets the leader's answer, errors included.
func TestFollowerForwardsLeaderOnlyCalls(t *testing.T) {
	leader := &recordingLeader{}
	leaderAddr := serve(t, func(gs *grpc.Server) {
		pb.RegisterKVServer(gs, leader)
		pb.RegisterLeaseServer(gs, leader)
		pb.RegisterWatchServer(gs, leader)
	})
	toLeader, err := grpc.NewClient(leaderAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = toLeader.Close() })
	follower := dialFollower(t, &etcdapi.Role{Leader: toLeader, LeaderID: 1})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, c := range leaderOnlyCalls {
		ctx := metadata.AppendToOutgoingContext(ctx, callerKey, c.method+"-caller")
		h, err := c.call(ctx, follower)
		want := c.method + " from " + c.method + "-caller"
		if got := leader.lastCall(); got != want {
			t.Errorf("%s through the follower: the leader saw %q, want %q", c.method, got, want)
		}
		if c.method == "Compact" {
			if !errors.Is(rpctypes.Error(err), rpctypes.ErrCompacted) {
				t.Errorf("Compact through the follower: error %v, want the leader's %v", err, rpctypes.ErrCompacted)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s through the follower: %v", c.method, err)
		} else if h.GetRevision() == 0 {
			t.Errorf("%s through the follower: header %v is not the leader's", c.method, h)
		}
	}

	sctx := metadata.AppendToOutgoingContext(ctx, callerKey, "stream-caller")
	keepAlive, err := pb.NewLeaseClient(follower).LeaseKeepAlive(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := keepAlive.Send(&pb.LeaseKeepAliveRequest{ID: 7}); err != nil {
		t.Fatal(err)
	}
	if r, err := keepAlive.Recv(); err != nil || r.ID != 7 {
		t.Errorf("LeaseKeepAlive through the follower: %v, %v; want the leader's answer for lease 7", r, err)
	}
	if got, want := leader.lastCall(), "LeaseKeepAlive from stream-caller"; got != want {
		t.Errorf("LeaseKeepAlive through the follower: the leader saw %q, want %q", got, want)
	}

	watch, err := pb.NewWatchClient(follower).Watch(sctx)
	if err != nil {
		t.Fatal(err)
	}
	create := &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("w")}}
	if err := watch.Send(&pb.WatchRequest{RequestUnion: create}); err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || len(r.Events) != 1 || string(r.Events[0].Kv.Key) != "w" {
		t.Errorf("Watch through the follower: %v, %v; want the leader's event on w", r, err)
	}
	if got, want := leader.lastCall(), "Watch from stream-caller"; got != want {
		t.Errorf("Watch through the follower: the leader saw %q, want %q", got, want)
	}
}

// TestFollowerWithoutLeaderAnswersNoLeader: a follower that knows no leader
// answers every leader-only call with etcd's "no leader", which clients
// retry on another member.
func TestFollowerWithoutLeaderAnswersNoLeader(t *testing.T) {
	follower := dialFollower(t, &etcdapi.Role{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wantNoLeader := func(what string, err error) {
		t.Helper()
		if !errors.Is(rpctypes.Error(err), rpctypes.ErrNoLeader) {
			t.Errorf("%s without a leader: %v, want %v", what, err, rpctypes.ErrNoLeader)
		}
	}
	for _, c := range leaderOnlyCalls {
		_, err := c.call(ctx, follower)
		wantNoLeader(c.method, err)
	}
	keepAlive, err := pb.NewLeaseClient(follower).LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = keepAlive.Recv()
	wantNoLeader("LeaseKeepAlive", err)
	watch, err := pb.NewWatchClient(follower).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = watch.Recv()
	wantNoLeader("Watch", err)
}
