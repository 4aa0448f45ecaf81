package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/plugins/memkv"
)

// TestQuotaMeasuresOncePerWindow: under a quota, writes do not ask the
// engine for its size one by one: at most once per second of writing (the
// quota's window), plus the first measure.
func TestQuotaMeasuresOncePerWindow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	store := &sizedStore{Store: memkv.New()}
	srv := servertest.Start(t, servertest.Options{Store: store, QuotaBackendBytes: 1 << 30})
	c := pb.NewKVClient(srv.Client(t).ActiveConnection())
	const writes = 300
	before, start := store.calls.Load(), time.Now()
	for i := range writes {
		if _, err := c.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	// An upper bound from the time the writes took, not a speed
	// requirement: a slow run is allowed more measures.
	calls, limit := store.calls.Load()-before, int64(time.Since(start)/time.Second)+2
	t.Logf("%d writes measured the store %d times", writes, calls)
	if calls > limit || calls >= writes {
		t.Errorf("%d writes measured the store %d times, want at most %d", writes, calls, limit)
	}
}
