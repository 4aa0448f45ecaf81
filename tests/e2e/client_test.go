package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The client tests use go.etcd.io/etcd/client/v3, the library
// kube-apiserver is built on.

func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestClientKVAndTxn(t *testing.T) {
	t.Parallel()
	n := startNode(t, nodeOptions{})
	cli := n.client(t)
	ctx := testCtx(t, 60*time.Second)

	put, err := cli.Put(ctx, "c/a", "1")
	if err != nil {
		t.Fatal(err)
	}
	if put.Header.Revision != 2 {
		t.Errorf("first put on a fresh store: revision %d, want 2", put.Header.Revision)
	}
	put2, err := cli.Put(ctx, "c/a", "2", clientv3.WithPrevKV())
	if err != nil {
		t.Fatal(err)
	}
	if put2.PrevKv == nil || string(put2.PrevKv.Value) != "1" || put2.Header.Revision != 3 {
		t.Errorf("put with prev kv: prev %v, revision %d; want value 1, revision 3", put2.PrevKv, put2.Header.Revision)
	}
	if _, err := cli.Put(ctx, "c/b", "x"); err != nil {
		t.Fatal(err)
	}

	get, err := cli.Get(ctx, "c/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if get.Count != 2 || len(get.Kvs) != 2 || string(get.Kvs[0].Key) != "c/a" || string(get.Kvs[0].Value) != "2" ||
		get.Kvs[0].Version != 2 || get.Kvs[0].CreateRevision != 2 || get.Kvs[0].ModRevision != 3 {
		t.Fatalf("get prefix: %+v", get)
	}
	// kube-apiserver's paging: a limit reports the full count and More.
	page, err := cli.Get(ctx, "c/", clientv3.WithPrefix(), clientv3.WithLimit(1))
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Kvs) != 1 || page.Count != 2 || !page.More {
		t.Errorf("get with limit 1: %d kvs, count %d, more %v; want 1, 2, true", len(page.Kvs), page.Count, page.More)
	}
	old, err := cli.Get(ctx, "c/a", clientv3.WithRev(2))
	if err != nil {
		t.Fatal(err)
	}
	if len(old.Kvs) != 1 || string(old.Kvs[0].Value) != "1" {
		t.Errorf("get at revision 2: %+v, want value 1", old.Kvs)
	}

	// kube-apiserver's optimistic update: compare mod revision, put, else get.
	txn, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision("c/a"), "=", 3)).
		Then(clientv3.OpPut("c/a", "3")).
		Else(clientv3.OpGet("c/a")).
		Commit()
	if err != nil {
		t.Fatal(err)
	}
	if !txn.Succeeded || txn.Header.Revision != 5 {
		t.Errorf("txn on current mod revision: succeeded=%v revision=%d, want true, 5", txn.Succeeded, txn.Header.Revision)
	}
	txn, err = cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision("c/a"), "=", 3)).
		Then(clientv3.OpPut("c/a", "never")).
		Else(clientv3.OpGet("c/a")).
		Commit()
	if err != nil {
		t.Fatal(err)
	}
	if txn.Succeeded {
		t.Fatal("txn on a stale mod revision succeeded")
	}
	if r := txn.Responses[0].GetResponseRange(); r == nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "3" || r.Kvs[0].ModRevision != 5 {
		t.Errorf("txn else branch get: %+v, want value 3 at mod revision 5", r)
	}
	if txn.Header.Revision != 5 {
		t.Errorf("a txn that wrote nothing moved the revision to %d", txn.Header.Revision)
	}

	del, err := cli.Delete(ctx, "c/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	if err != nil {
		t.Fatal(err)
	}
	if del.Deleted != 2 || len(del.PrevKvs) != 2 || del.Header.Revision != 6 {
		t.Errorf("delete prefix: deleted %d, prev %d, revision %d; want 2, 2, 6 (one revision for the whole delete)", del.Deleted, len(del.PrevKvs), del.Header.Revision)
	}
	after, err := cli.Get(ctx, "c/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if after.Count != 0 {
		t.Errorf("count after delete: %d", after.Count)
	}
}

func TestClientWatchAndLease(t *testing.T) {
	t.Parallel()
	n := startNode(t, nodeOptions{})
	cli := n.client(t)
	ctx := testCtx(t, 60*time.Second)

	start, err := cli.Put(ctx, "seed", "x")
	if err != nil {
		t.Fatal(err)
	}
	wch := cli.Watch(ctx, "w/", clientv3.WithPrefix(), clientv3.WithRev(start.Header.Revision+1), clientv3.WithPrevKV())

	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if lease.TTL != 60 {
		t.Errorf("granted TTL %d, want 60", lease.TTL)
	}
	if _, err := cli.Put(ctx, "w/a", "1", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "w/a", "2", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	ka, err := cli.KeepAliveOnce(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ka.TTL != 60 {
		t.Errorf("keep-alive TTL %d, want 60", ka.TTL)
	}
	ttl, err := cli.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL != 60 || ttl.TTL <= 0 || ttl.TTL > 60 || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != "w/a" {
		t.Errorf("time to live: granted %d remaining %d keys %q; want 60, (0,60], [w/a]", ttl.GrantedTTL, ttl.TTL, ttl.Keys)
	}
	leases, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 1 || leases.Leases[0].ID != lease.ID {
		t.Errorf("leases: %+v, want just %x", leases.Leases, lease.ID)
	}
	// Revoking deletes the attached key: a DELETE event for the watch.
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	if ttl, err := cli.TimeToLive(ctx, lease.ID); err != nil || ttl.TTL != -1 {
		t.Errorf("time to live after revoke: %+v, %v; want TTL -1", ttl, err)
	}

	want := []struct {
		typ   mvccpb.Event_EventType
		value string
		prev  string
	}{
		{mvccpb.PUT, "1", ""},
		{mvccpb.PUT, "2", "1"},
		{mvccpb.DELETE, "", "2"},
	}
	var got []*clientv3.Event
	for len(got) < len(want) {
		select {
		case resp, ok := <-wch:
			if !ok {
				t.Fatalf("watch closed after %d events: %v", len(got), ctx.Err())
			}
			if err := resp.Err(); err != nil {
				t.Fatalf("watch: %v", err)
			}
			got = append(got, resp.Events...)
		case <-ctx.Done():
			t.Fatalf("watch: %d of %d events before timeout", len(got), len(want))
		}
	}
	for i, w := range want {
		e := got[i]
		prev := ""
		if e.PrevKv != nil {
			prev = string(e.PrevKv.Value)
		}
		if e.Type != w.typ || string(e.Kv.Key) != "w/a" || string(e.Kv.Value) != w.value || prev != w.prev {
			t.Errorf("event %d: %v %s=%q prev %q; want %v w/a=%q prev %q", i, e.Type, e.Kv.Key, e.Kv.Value, prev, w.typ, w.value, w.prev)
		}
		if e.Kv.ModRevision != start.Header.Revision+int64(i)+1 {
			t.Errorf("event %d at revision %d, want %d", i, e.Kv.ModRevision, start.Header.Revision+int64(i)+1)
		}
	}
}

func TestClientStatusAndMembers(t *testing.T) {
	t.Parallel()
	n := startNode(t, nodeOptions{args: []string{"--advertise-client-urls=http://engram.example:2379"}})
	cli := n.client(t)
	ctx := testCtx(t, 30*time.Second)

	st, err := cli.Status(ctx, n.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if !versionAtLeast(st.Version, 3, 5, 13) {
		t.Errorf("status version %q, want >= 3.5.13", st.Version)
	}
	if st.Header.MemberId == 0 || st.Leader != st.Header.MemberId {
		t.Errorf("status: member %x leader %x; a single member leads itself", st.Header.MemberId, st.Leader)
	}
	ml, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ml.Members) != 1 || ml.Members[0].Name != n.name ||
		len(ml.Members[0].ClientURLs) != 1 || ml.Members[0].ClientURLs[0] != "http://engram.example:2379" {
		t.Errorf("member list: %+v; want one member %q advertising http://engram.example:2379", ml.Members, n.name)
	}
}

// TestConfiguredLimits checks that limits.* reach the server: etcd refuses
// an oversized request and a transaction with too many operations.
func TestConfiguredLimits(t *testing.T) {
	t.Parallel()
	n := startNode(t, nodeOptions{args: []string{"--limits.max-request-bytes=4096", "--limits.max-txn-ops=3"}})
	cli := n.client(t)
	ctx := testCtx(t, 30*time.Second)

	if _, err := cli.Put(ctx, "small", strings.Repeat("x", 1024)); err != nil {
		t.Fatalf("put under the limit: %v", err)
	}
	_, err := cli.Put(ctx, "big", strings.Repeat("x", 8192))
	if !errors.Is(err, rpctypes.ErrRequestTooLarge) {
		t.Errorf("put over limits.max-request-bytes: %v, want %v", err, rpctypes.ErrRequestTooLarge)
	}

	ops := func(k int) []clientv3.Op {
		var out []clientv3.Op
		for i := range k {
			out = append(out, clientv3.OpPut(fmt.Sprintf("txn/%d", i), "v"))
		}
		return out
	}
	if _, err := cli.Txn(ctx).Then(ops(3)...).Commit(); err != nil {
		t.Fatalf("txn at limits.max-txn-ops: %v", err)
	}
	_, err = cli.Txn(ctx).Then(ops(4)...).Commit()
	if !errors.Is(err, rpctypes.ErrTooManyOps) {
		t.Errorf("txn over limits.max-txn-ops: %v, want %v", err, rpctypes.ErrTooManyOps)
	}
}

// TestProgressNotifyInterval checks watch.progress-notify-interval reaches
// the server: an idle watch with progress_notify gets progress responses.
func TestProgressNotifyInterval(t *testing.T) {
	t.Parallel()
	n := startNode(t, nodeOptions{args: []string{"--watch.progress-notify-interval=500ms"}})
	cli := n.client(t)
	ctx := testCtx(t, 30*time.Second)

	put, err := cli.Put(ctx, "p", "v")
	if err != nil {
		t.Fatal(err)
	}
	wch := cli.Watch(ctx, "idle/", clientv3.WithPrefix(), clientv3.WithProgressNotify())
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				t.Fatalf("watch closed: %v", ctx.Err())
			}
			if err := resp.Err(); err != nil {
				t.Fatalf("watch: %v", err)
			}
			if resp.IsProgressNotify() {
				if resp.Header.Revision < put.Header.Revision {
					t.Fatalf("progress notification at revision %d, before the last write %d", resp.Header.Revision, put.Header.Revision)
				}
				return
			}
		case <-ctx.Done():
			t.Fatal("no progress notification within 30s on an idle watch with a 500ms interval")
		}
	}
}
