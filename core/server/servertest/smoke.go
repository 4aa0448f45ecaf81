package servertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Smoke drives srv through clientv3: puts, a range, a
// transaction that succeeds and one that fails, deletes, a historical read,
// a compaction and a watch: what every engine the server runs on must
// carry, as a quick check that a store is wired in whole.
func Smoke(t testing.TB, srv *Server) {
	t.Helper()
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
