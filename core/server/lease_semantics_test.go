package server_test

import (
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLeaseExpiryDeletesKeysWithEvents runs the server on a fake clock: a
// lease expires exactly at its TTL, deleting its keys in one revision, and
// keep-alives hold it however long they go on.
func TestLeaseExpiryDeletesKeysWithEvents(t *testing.T) {
	t.Parallel()
	c, ctx, clk := setupClock(t)
	g := must(c.Grant(ctx, 1))(t)
	if g.TTL != 2 {
		t.Fatalf("granted TTL %d, want etcd's minimum 2", g.TTL)
	}
	expiry := clk.Now().Add(2 * time.Second)
	must(c.Put(ctx, "/masterleases/10.0.0.1", "ip", clientv3.WithLease(g.ID)))(t)
	p := must(c.Put(ctx, "/masterleases/10.0.0.2", "ip", clientv3.WithLease(g.ID)))(t)
	ttl := must(c.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys()))(t)
	if len(ttl.Keys) != 2 || ttl.GrantedTTL != 2 || ttl.TTL != 2 {
		t.Fatalf("time to live: %+v", ttl)
	}
	if l := must(c.Leases(ctx))(t); len(l.Leases) != 1 {
		t.Fatalf("leases: %+v", l.Leases)
	}
	wch := c.Watch(ctx, "/masterleases/", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(p.Header.Revision+1))
	clk.WaitArmed(expiry) // the lessor waits for this lease's expiry
	clk.Advance(2*time.Second - time.Nanosecond)
	// etcd truncates the remaining time to whole seconds: a live lease
	// with under a second left reads 0 (an expired one reads -1, below).
	if r := must(c.TimeToLive(ctx, g.ID))(t); r.TTL != 0 {
		t.Fatalf("lease a nanosecond before its expiry: TTL %d, want 0", r.TTL)
	}
	clk.Advance(time.Nanosecond)
	var dels []*clientv3.Event
	for len(dels) < 2 {
		select {
		case wr := <-wch:
			dels = append(dels, wr.Events...)
		case <-ctx.Done():
			t.Fatal("lease did not expire")
		}
	}
	for _, ev := range dels {
		if ev.Type != mvccpb.DELETE || ev.PrevKv == nil || string(ev.PrevKv.Value) != "ip" {
			t.Fatalf("expiry event %+v", ev)
		}
	}
	if dels[0].Kv.ModRevision != dels[1].Kv.ModRevision {
		t.Error("keys of one lease must be deleted in one revision")
	}
	if r := must(c.TimeToLive(ctx, g.ID))(t); r.TTL != -1 {
		t.Fatalf("expired lease TTL %d, want -1", r.TTL)
	}
	// KeepAlive keeps a lease alive past many TTLs; Revoke deletes at once.
	g2 := must(c.Grant(ctx, 2))(t)
	must(c.Put(ctx, "kept", "v", clientv3.WithLease(g2.ID)))(t)
	for range 4 {
		if ka := must(c.KeepAliveOnce(ctx, g2.ID))(t); ka.TTL != 2 {
			t.Fatalf("keepalive TTL %d", ka.TTL)
		}
		clk.Advance(time.Second)
		if r := must(c.TimeToLive(ctx, g2.ID))(t); r.TTL != 1 {
			t.Fatalf("a second after a keepalive: TTL %d, want 1", r.TTL)
		}
	}
	if r := must(c.Get(ctx, "kept"))(t); len(r.Kvs) != 1 {
		t.Fatal("key of a kept-alive lease expired")
	}
	must(c.Revoke(ctx, g2.ID))(t)
	if r := must(c.Get(ctx, "kept"))(t); len(r.Kvs) != 0 {
		t.Fatal("revoke did not delete the key")
	}
	if _, err := c.Revoke(ctx, g2.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("revoke twice: %v", err)
	}
}
