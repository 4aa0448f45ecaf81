package server_test

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRangeStreamClusterFollower: a follower serves RangeStream itself, as
// it serves Range (reads go through its read barrier, never to the
// leader): after writes forwarded to the leader, the follower's stream
// holds them all and equals the leader's Get at the stream's revision.
func TestRangeStreamClusterFollower(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 2)
	l := c.leader(-1)
	f := 1 - l
	c.following(f, l)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	fc, lc := c.client(f), c.client(l)
	for k := range 300 {
		key := fmt.Sprintf("f/%04d", k)
		if _, err := fc.Put(ctx, key, string(value(key, 512))); err != nil {
			t.Fatal(err)
		}
	}
	ch, err := fc.GetStream(ctx, "f/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got, err := clientv3.GetStreamToGetResponse(ch)
	if err != nil {
		t.Fatal(err)
	}
	want, err := lc.Get(ctx, "f/", clientv3.WithPrefix(), clientv3.WithRev(got.Header.Revision))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 300 || got.Count != 300 || len(want.Kvs) != 300 {
		t.Fatalf("follower stream: %d keys, count %d; leader's get: %d keys", len(got.Kvs), got.Count, len(want.Kvs))
	}
	for i := range got.Kvs {
		if a, b := showKV(got.Kvs[i]), showKV(want.Kvs[i]); a != b {
			t.Fatalf("key-value %d: follower's stream %s, leader's get %s", i, a, b)
		}
	}
}
