package server_test

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
)

// TestRestartKeepsDataRevisionsLeasesAndWatchHistory: a server started again
// on the same store serves the same keys, revisions, leases and watch
// history.
func TestRestartKeepsDataRevisionsLeasesAndWatchHistory(t *testing.T) {
	t.Parallel()
	store := memkv.New()
	var leaseID clientv3.LeaseID
	{
		srv := servertest.Start(t, store, servertest.Options{})
		c := srv.Client(t)
		ctx := context.Background()
		must(c.Put(ctx, "a", "1"))(t)
		must(c.Put(ctx, "a", "2"))(t)
		leaseID = must(c.Grant(ctx, 3600))(t).ID
		must(c.Put(ctx, "b", "1", clientv3.WithLease(leaseID)))(t)
		must(c.Delete(ctx, "a"))(t)
		// Shut the first server down before the second one opens the store.
		srv.Stop()
	}
	srv := servertest.Start(t, store, servertest.Options{})
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := must(c.Get(ctx, "b"))(t)
	if r.Header.Revision != 5 || r.Kvs[0].Lease != int64(leaseID) {
		t.Fatalf("after restart: rev %d kvs %+v", r.Header.Revision, r.Kvs)
	}
	if ttl := must(c.TimeToLive(ctx, leaseID, clientv3.WithAttachedKeys()))(t); ttl.TTL <= 0 || len(ttl.Keys) != 1 {
		t.Fatalf("lease after restart: %+v", ttl)
	}
	if p := must(c.Put(ctx, "c", "1"))(t); p.Header.Revision != 6 {
		t.Fatalf("revision after restart %d, want 6", p.Header.Revision)
	}
	wch := c.Watch(ctx, "a", clientv3.WithRev(2), clientv3.WithPrevKV())
	var evs []*clientv3.Event
	for len(evs) < 3 {
		select {
		case wr := <-wch:
			evs = append(evs, wr.Events...)
		case <-ctx.Done():
			t.Fatalf("watch from before the restart got %d events", len(evs))
		}
	}
	if evs[0].Kv.ModRevision != 2 || evs[1].Kv.ModRevision != 3 || evs[2].Type != mvccpb.DELETE || string(evs[2].PrevKv.Value) != "2" {
		t.Fatalf("history after restart: %v", evs)
	}
}
