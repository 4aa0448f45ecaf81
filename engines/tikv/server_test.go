package tikv_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/tikv/tikvmock"
)

// TestServerOnTiKV runs a complete Engram server on the adaptor (mock
// cluster, ten regions) and drives it through clientv3: KV, a transaction,
// a watch, a lease, and a restart on the same store.
func TestServerOnTiKV(t *testing.T) {
	store := openMock(t, tikvmock.Options{})
	t.Cleanup(func() { _ = store.Close() })
	srv := servertest.Start(t, store, servertest.Options{})
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	wch := cli.Watch(ctx, "/registry/pods/", clientv3.WithPrefix())

	put, err := cli.Put(ctx, "/registry/pods/default/a", "v1")
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	rev := put.Header.Revision
	for i, k := range []string{"/registry/pods/default/b", "/registry/pods/kube-system/c", "/registry/services/x"} {
		if _, err := cli.Put(ctx, k, "v"); err != nil {
			t.Fatalf("Put %d: %v", i, err)
		}
	}
	got, err := cli.Get(ctx, "/registry/pods/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("Get prefix: %v", err)
	}
	if len(got.Kvs) != 3 || string(got.Kvs[0].Key) != "/registry/pods/default/a" || string(got.Kvs[0].Value) != "v1" {
		t.Fatalf("Get prefix = %v, want the 3 pods", got.Kvs)
	}

	// Kubernetes' optimistic update: compare the mod revision, then put.
	txn, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision("/registry/pods/default/a"), "=", rev)).
		Then(clientv3.OpPut("/registry/pods/default/a", "v2")).
		Else(clientv3.OpGet("/registry/pods/default/a")).
		Commit()
	if err != nil || !txn.Succeeded {
		t.Fatalf("Txn on the current revision = %+v, %v; want success", txn, err)
	}
	stale, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision("/registry/pods/default/a"), "=", rev)).
		Then(clientv3.OpPut("/registry/pods/default/a", "v3")).
		Commit()
	if err != nil || stale.Succeeded {
		t.Fatalf("Txn on a stale revision = %+v, %v; want a failed comparison", stale, err)
	}

	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	if _, err := cli.Put(ctx, "/registry/pods/default/leased", "x", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatalf("Put with lease: %v", err)
	}
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	if g, err := cli.Get(ctx, "/registry/pods/default/leased"); err != nil || len(g.Kvs) != 0 {
		t.Fatalf("Get of a revoked lease's key = %v, %v; want nothing", g, err)
	}

	// The watch sees every change under the prefix, in order: 3 pod
	// puts, the txn's put, the leased put and its deletion.
	want := []string{"PUT /registry/pods/default/a", "PUT /registry/pods/default/b", "PUT /registry/pods/kube-system/c",
		"PUT /registry/pods/default/a", "PUT /registry/pods/default/leased", "DELETE /registry/pods/default/leased"}
	var seen []string
	for len(seen) < len(want) {
		select {
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil {
				t.Fatalf("watch ended: %v (saw %q)", resp.Err(), seen)
			}
			for _, ev := range resp.Events {
				seen = append(seen, ev.Type.String()+" "+string(ev.Kv.Key))
			}
		case <-ctx.Done():
			t.Fatalf("watch: saw %q, want %q", seen, want)
		}
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("watch events = %q, want %q", seen, want)
		}
	}

	// A restart on the same TiKV keeps the data and the revision.
	head, err := cli.Get(ctx, "/registry/pods/default/a")
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	srv2 := servertest.Start(t, store, servertest.Options{})
	cli2 := srv2.Client(t)
	after, err := cli2.Get(ctx, "/registry/pods/default/a")
	if err != nil {
		t.Fatalf("Get after restart: %v", err)
	}
	if len(after.Kvs) != 1 || string(after.Kvs[0].Value) != "v2" || after.Header.Revision != head.Header.Revision {
		t.Fatalf("after restart: %v at revision %d; want v2 at revision %d", after.Kvs, after.Header.Revision, head.Header.Revision)
	}
	if _, err := cli2.Put(ctx, "/registry/pods/default/d", "v"); err != nil {
		t.Fatalf("Put after restart: %v", err)
	}
	st := store.Stats()
	t.Logf("adaptor: %+v", st)
	if st.Commits < 8 || st.Uncertain != 0 {
		t.Errorf("adaptor stats %+v: want every write committed through TiKV, none uncertain", st)
	}
}
