package etcdapi_test

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/engramkv/engram/core/internal/etcdapi"
)

// TestHeldCallRunsUnderAKnownRoleWhenDraining: a node that hands
// leadership off and is stopped right after (a rolling upgrade) has calls
// waiting for its next role when the drain starts. If the next role is
// already known, they run under it instead of ending "leader changed":
// here the role changes and the drain begins before the held call even
// starts to wait, so both are ready when it does, every time.
func TestHeldCallRunsUnderAKnownRoleWhenDraining(t *testing.T) {
	leader, toLeader := dialLeader(t)
	for i := range 50 {
		var follower *etcdapi.Services
		follower = etcdapi.New(etcdapi.Options{Role: &etcdapi.Role{}, Name: "follower", LeaderWait: time.Minute, OnLeaderWait: func() {
			follower.SetRole(&etcdapi.Role{Leader: toLeader, LeaderID: 2})
			follower.Drain()
		}})
		conn, err := grpc.NewClient(serve(t, follower.Register), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err = pb.NewKVClient(conn).Put(ctx, &pb.PutRequest{Key: []byte("k")})
		cancel()
		_ = conn.Close()
		if err != nil {
			t.Fatalf("attempt %d: the held Put, with the next role known as the drain began: %v", i, err)
		}
	}
	if got := leader.lastCall(); got == "" {
		t.Fatal("the leader saw no Put")
	}
}
