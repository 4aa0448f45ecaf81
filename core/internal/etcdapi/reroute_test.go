package etcdapi_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/engramkv/engram/core/internal/etcdapi"
)

// holdingFollower is a follower whose requests wait up to wait for a
// leader; each wait that starts is signalled on waits.
func holdingFollower(t *testing.T, role *etcdapi.Role, wait time.Duration) (*etcdapi.Services, *grpc.ClientConn, <-chan struct{}) {
	t.Helper()
	waits := make(chan struct{}, 64)
	follower := etcdapi.New(etcdapi.Options{Role: role, Name: "follower", LeaderWait: wait, OnLeaderWait: func() { waits <- struct{}{} }})
	conn, err := grpc.NewClient(serve(t, follower.Register), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return follower, conn, waits
}

// dialLeader serves a recording leader and returns it with a connection.
func dialLeader(t *testing.T) (*recordingLeader, *grpc.ClientConn) {
	t.Helper()
	leader := &recordingLeader{}
	addr := serve(t, func(gs *grpc.Server) {
		pb.RegisterKVServer(gs, leader)
		pb.RegisterLeaseServer(gs, leader)
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return leader, conn
}

// putAsync sends a Put through conn, as caller (metadata) when not empty,
// and delivers its error.
func putAsync(t *testing.T, conn *grpc.ClientConn, caller string) <-chan error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	if caller != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, callerKey, caller)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := pb.NewKVClient(conn).Put(ctx, &pb.PutRequest{Key: []byte("k")})
		errc <- err
	}()
	return errc
}

// TestFollowerHoldsCallsUntilALeaderIsKnown: during an election a follower
// knows no leader. Each leader-only call waits, and once the follower
// learns the leader it is forwarded there and answered as if the election
// had never happened.
func TestFollowerHoldsCallsUntilALeaderIsKnown(t *testing.T) {
	follower, conn, waits := holdingFollower(t, &etcdapi.Role{}, time.Minute)
	leader, toLeader := dialLeader(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	type answer struct {
		method string
		err    error
	}
	answers := make(chan answer, len(leaderOnlyCalls))
	for _, c := range leaderOnlyCalls {
		go func() {
			ctx := metadata.AppendToOutgoingContext(ctx, callerKey, c.method+"-caller")
			_, err := c.call(ctx, conn)
			answers <- answer{c.method, err}
		}()
	}
	for range leaderOnlyCalls {
		select {
		case <-waits:
		case a := <-answers:
			t.Fatalf("%s answered %v before a leader was known, want it held", a.method, a.err)
		case <-ctx.Done():
			t.Fatal("the calls never started waiting for a leader")
		}
	}
	follower.SetRole(&etcdapi.Role{Leader: toLeader, LeaderID: 1})
	for range leaderOnlyCalls {
		a := <-answers
		if a.method == "Compact" {
			// The leader's own answer passes through.
			if !errors.Is(rpctypes.Error(a.err), rpctypes.ErrCompacted) {
				t.Errorf("Compact held, then forwarded: %v, want the leader's %v", a.err, rpctypes.ErrCompacted)
			}
			continue
		}
		if a.err != nil {
			t.Errorf("%s held, then forwarded: %v", a.method, a.err)
		}
	}
	leader.mu.Lock()
	defer leader.mu.Unlock()
	if len(leader.calls) != len(leaderOnlyCalls) {
		t.Errorf("the leader saw %d calls, want each of the %d once: %v", len(leader.calls), len(leaderOnlyCalls), leader.calls)
	}
}

// TestFollowerHoldsBoundedByLeaderWait: with no leader for longer than
// LeaderWait, the call is answered etcd's "no leader", as before; a role
// change that still names no leader does not end the wait early.
func TestFollowerHoldsBoundedByLeaderWait(t *testing.T) {
	follower, conn, waits := holdingFollower(t, &etcdapi.Role{}, 200*time.Millisecond)
	errc := putAsync(t, conn, "")
	<-waits
	follower.SetRole(&etcdapi.Role{}) // an election round without a winner
	<-waits
	if err := <-errc; !errors.Is(rpctypes.Error(err), rpctypes.ErrNoLeader) {
		t.Errorf("Put with no leader past LeaderWait: %v, want %v", err, rpctypes.ErrNoLeader)
	}
}

// TestFollowerHoldsCallsItCouldNotSend: the follower's connection points
// at a leader that is gone (nothing listens there), so gRPC cannot send the
// call: the old leader never saw it and it is safe to send again. It
// waits for the next leader instead of answering "leader changed".
func TestFollowerHoldsCallsItCouldNotSend(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := l.Addr().String()
	_ = l.Close()
	toGone, err := grpc.NewClient(gone, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = toGone.Close() })
	follower, conn, waits := holdingFollower(t, &etcdapi.Role{Leader: toGone, LeaderID: 1}, time.Minute)
	leader, toLeader := dialLeader(t)

	errc := putAsync(t, conn, "held")
	select {
	case <-waits:
	case err := <-errc:
		t.Fatalf("Put to a gone leader answered %v, want it held for the next leader", err)
	}
	follower.SetRole(&etcdapi.Role{Leader: toLeader, LeaderID: 2})
	if err := <-errc; err != nil {
		t.Fatalf("Put held, then forwarded to the new leader: %v", err)
	}
	if got, want := leader.lastCall(), "Put from held"; got != want {
		t.Errorf("the new leader saw %q, want %q", got, want)
	}
}

// brokenLeader accepts calls and then drops its connection without
// answering: a leader killed with the call in flight, which it may have
// applied.
type brokenLeader struct {
	pb.UnimplementedKVServer
	reached chan struct{}
	release chan struct{}
}

func (b *brokenLeader) Put(ctx context.Context, _ *pb.PutRequest) (*pb.PutResponse, error) {
	b.reached <- struct{}{}
	<-b.release
	return nil, errors.New("unreachable")
}

// TestFollowerDoesNotResendCallsTheLeaderMayHaveApplied: a forwarded Put
// reached the leader, whose connection then broke. The leader may have
// applied it, so it must not be sent again: the answer is "leader
// changed", at once, without waiting.
func TestFollowerDoesNotResendCallsTheLeaderMayHaveApplied(t *testing.T) {
	b := &brokenLeader{reached: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(func() { close(b.release) })
	addr := serve(t, func(gs *grpc.Server) { pb.RegisterKVServer(gs, b) })
	toLeader, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	_, conn, waits := holdingFollower(t, &etcdapi.Role{Leader: toLeader, LeaderID: 1}, time.Minute)

	errc := putAsync(t, conn, "")
	<-b.reached
	_ = toLeader.Close() // the follower's link to the leader breaks mid-call
	if err := <-errc; !errors.Is(rpctypes.Error(err), rpctypes.ErrLeaderChanged) {
		t.Errorf("Put whose leader broke mid-call: %v, want %v", err, rpctypes.ErrLeaderChanged)
	}
	select {
	case <-waits:
		t.Error("the Put waited to be sent again although the leader may have applied it")
	default:
	}
}
