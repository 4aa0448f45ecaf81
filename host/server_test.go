package host

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/server/servertest"
)

// TestServerOnMemKVWasm runs the whole server on memkv.wasm and drives it
// through clientv3 (serverSmoke).
func TestServerOnMemKVWasm(t *testing.T) {
	p := loadPlugin(t, "memkv", Options{})
	st, err := p.Open(context.Background(), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	serverSmoke(t, servertest.Start(t, st, servertest.Options{}))
}

// serverSmoke drives a server through clientv3: puts, a range, a
// transaction that succeeds and one that fails, deletes, a historical read,
// a compaction and a watch.
func serverSmoke(t *testing.T, srv *servertest.Server) {
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wch := c.Watch(ctx, "/registry/", clientv3.WithPrefix())
	for i := range 30 {
		if _, err := c.Put(ctx, fmt.Sprintf("/registry/pods/p%02d", i), fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := c.Get(ctx, "/registry/pods/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 30 {
		t.Fatalf("range: %v, %d kvs", err, len(resp.Kvs))
	}
	page, err := c.Get(ctx, "/registry/pods/", clientv3.WithPrefix(), clientv3.WithLimit(7))
	if err != nil || len(page.Kvs) != 7 || !page.More || page.Count != 30 {
		t.Fatalf("limited range: %v, %d kvs, more=%v, count=%d", err, len(page.Kvs), page.More, page.Count)
	}
	rev := resp.Kvs[3].ModRevision
	txn, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision("/registry/pods/p03"), "=", rev)).
		Then(clientv3.OpPut("/registry/pods/p03", "updated")).Commit()
	if err != nil || !txn.Succeeded {
		t.Fatalf("txn: %v, succeeded=%v", err, txn != nil && txn.Succeeded)
	}
	txn, err = c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision("/registry/pods/p03"), "=", rev)).
		Then(clientv3.OpPut("/registry/pods/p03", "stale")).Commit()
	if err != nil || txn.Succeeded {
		t.Fatalf("stale txn: %v, succeeded=%v", err, txn != nil && txn.Succeeded)
	}
	if _, err := c.Delete(ctx, "/registry/pods/p1", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	resp, err = c.Get(ctx, "/registry/pods/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 20 {
		t.Fatalf("count after delete: %v, %d", err, resp.Count)
	}
	old, err := c.Get(ctx, "/registry/pods/p03", clientv3.WithRev(rev))
	if err != nil || len(old.Kvs) != 1 || string(old.Kvs[0].Value) != "v3" {
		t.Fatalf("historical read: %v %v", err, old)
	}
	events := 0
	for events < 41 { // 30 puts, 1 txn put, 10 deletes
		select {
		case w := <-wch:
			events += len(w.Events)
		case <-ctx.Done():
			t.Fatalf("watch delivered %d events", events)
		}
	}
	if _, err := c.Compact(ctx, rev+1, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact: %v", err)
	}
	if _, err := c.Get(ctx, "/registry/pods/p03", clientv3.WithRev(rev)); err == nil {
		t.Errorf("read below the compacted revision succeeded")
	}
	cur, err := c.Get(ctx, "/registry/pods/p03")
	if err != nil || len(cur.Kvs) != 1 || string(cur.Kvs[0].Value) != "updated" {
		t.Fatalf("read after compaction: %v %v", err, cur)
	}
}

// TestServerOnFaultyPlugin: misbehaving reads give the client a clean gRPC
// error, an UNCERTAIN commit is resolved by the server, and the server keeps
// serving with its data intact.
func TestServerOnFaultyPlugin(t *testing.T) {
	e := newFaulty(t, Options{}, 2)
	srv := servertest.Start(t, e.store, servertest.Options{})
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 10 {
		if _, err := c.Put(ctx, fmt.Sprintf("k%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []string{"panic", "trap", "garbage", "wronglen", "sleep"} {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Get(rctx, "faulty:"+w)
		rcancel()
		if err == nil {
			t.Errorf("%s: Get succeeded", w)
		} else {
			t.Logf("%s: client got %v", w, err)
		}
	}
	if _, err := c.Put(ctx, "w/faulty:uncertain", "applied"); err != nil {
		t.Errorf("an applied commit answered UNCERTAIN must resolve to success: %v", err)
	}
	resp, err := c.Get(ctx, "k", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 10 {
		t.Fatalf("after misbehaviours: %v, %d keys", err, len(resp.Kvs))
	}
	got, err := c.Get(ctx, "w/faulty:uncertain")
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("uncertain write: %v %v", err, got)
	}
	if _, err := c.Put(ctx, "after", "ok"); err != nil {
		t.Fatal(err)
	}
	if e.store.Stats().Failures == 0 {
		t.Error("no instance was discarded")
	}
}
