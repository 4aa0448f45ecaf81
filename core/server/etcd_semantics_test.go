package server_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/plugins/memkv"
)

func setup(t *testing.T) (*clientv3.Client, context.Context) {
	t.Helper()
	srv := servertest.Start(t, servertest.Options{ProgressNotifyInterval: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return srv.Client(t), ctx
}

// must fails the test (by panicking, which the test runner reports with the
// caller's stack) when a client call returns an error. Go cannot pass a
// two-value call plus *testing.T to one function, so it cannot take t.
func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("unexpected error: %v", err))
	}
	return v
}

func TestRevisionsAndKeyValueFields(t *testing.T) {
	c, ctx := setup(t)
	if r := must(c.Get(ctx, "x")); r.Header.Revision != 1 {
		t.Fatalf("fresh store at revision %d, want 1", r.Header.Revision)
	}
	must(c.Put(ctx, "k", "v1")) // 2
	must(c.Put(ctx, "k", "v2")) // 3
	if r := must(c.Delete(ctx, "nothing")); r.Header.Revision != 3 || r.Deleted != 0 {
		t.Fatalf("deleting nothing moved the revision: %+v", r.Header)
	}
	kv := must(c.Get(ctx, "k")).Kvs[0]
	if kv.CreateRevision != 2 || kv.ModRevision != 3 || kv.Version != 2 || string(kv.Value) != "v2" {
		t.Fatalf("after update: %+v", kv)
	}
	must(c.Delete(ctx, "k"))     // 4
	must(c.Put(ctx, "k", "new")) // 5
	kv = must(c.Get(ctx, "k")).Kvs[0]
	if kv.CreateRevision != 5 || kv.ModRevision != 5 || kv.Version != 1 {
		t.Fatalf("re-create must reset create_revision and version: %+v", kv)
	}
	// A transaction writing two keys takes one revision.
	tr := must(c.Txn(ctx).Then(clientv3.OpPut("a", "1"), clientv3.OpPut("b", "2")).Commit())
	if tr.Header.Revision != 6 {
		t.Fatalf("txn revision %d, want 6", tr.Header.Revision)
	}
	for _, k := range []string{"a", "b"} {
		if kv := must(c.Get(ctx, k)).Kvs[0]; kv.ModRevision != 6 {
			t.Fatalf("%s mod revision %d", k, kv.ModRevision)
		}
	}
	// A failed compare takes none.
	tr = must(c.Txn(ctx).If(clientv3.Compare(clientv3.Value("a"), "=", "nope")).Then(clientv3.OpPut("a", "x")).Commit())
	if tr.Succeeded || tr.Header.Revision != 6 {
		t.Fatalf("failed compare: succeeded=%v rev=%d", tr.Succeeded, tr.Header.Revision)
	}
	// Reads at past revisions.
	if r := must(c.Get(ctx, "k", clientv3.WithRev(3))); len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v2" {
		t.Fatalf("get at rev 3: %+v", r.Kvs)
	}
	if r := must(c.Get(ctx, "k", clientv3.WithRev(4))); len(r.Kvs) != 0 {
		t.Fatalf("get at rev 4 (deleted): %+v", r.Kvs)
	}
	if r := must(c.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(5))); r.Count != 1 || r.Header.Revision != 6 {
		t.Fatalf("range at rev 5: count %d header %d", r.Count, r.Header.Revision)
	}
}

func TestRangeOptions(t *testing.T) {
	c, ctx := setup(t)
	for i := range 10 {
		must(c.Put(ctx, fmt.Sprintf("/r/%02d", i), fmt.Sprintf("v%d", 9-i)))
	}
	must(c.Put(ctx, "/r", "parent"))
	must(c.Put(ctx, "/s/0", "other"))
	r := must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithLimit(3)))
	if r.Count != 10 || len(r.Kvs) != 3 || !r.More || string(r.Kvs[0].Key) != "/r/00" {
		t.Fatalf("limit: count=%d len=%d more=%v", r.Count, len(r.Kvs), r.More)
	}
	// kube-apiserver continues from lastKey+"\x00".
	var keys []string
	from := "/r/"
	for {
		r := must(c.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd("/r/")), clientv3.WithLimit(4)))
		for _, kv := range r.Kvs {
			keys = append(keys, string(kv.Key))
		}
		if !r.More {
			break
		}
		from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
	if len(keys) != 10 {
		t.Fatalf("paginated list returned %d keys: %q", len(keys), keys)
	}
	if r := must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithCountOnly())); r.Count != 10 || len(r.Kvs) != 0 {
		t.Fatalf("count only: %+v", r)
	}
	if r := must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithKeysOnly())); len(r.Kvs) != 10 || r.Kvs[0].Value != nil {
		t.Fatalf("keys only returned values")
	}
	r = must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByValue, clientv3.SortAscend), clientv3.WithLimit(2)))
	if string(r.Kvs[0].Value) != "v0" || string(r.Kvs[1].Value) != "v1" || !r.More {
		t.Fatalf("sort by value: %q %q", r.Kvs[0].Value, r.Kvs[1].Value)
	}
	r = must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend)))
	if string(r.Kvs[0].Key) != "/r/09" {
		t.Fatalf("descending: %q", r.Kvs[0].Key)
	}
	r = must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithMinModRev(5), clientv3.WithMaxModRev(6)))
	if len(r.Kvs) != 2 {
		t.Fatalf("mod revision filter: %d kvs", len(r.Kvs))
	}
	r = must(c.Get(ctx, "/r/05", clientv3.WithFromKey()))
	if r.Count != 6 { // /r/05../r/09 and /s/0
		t.Fatalf("from key: count %d", r.Count)
	}
	r = must(c.Get(ctx, "", clientv3.WithFromKey()))
	if r.Count != 12 {
		t.Fatalf("whole keyspace: %d", r.Count)
	}
}

func TestErrorsMatchEtcd(t *testing.T) {
	c, ctx := setup(t)
	must(c.Put(ctx, "a", "1"))
	must(c.Put(ctx, "a", "2"))
	must(c.Put(ctx, "a", "3"))
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"future revision", second(c.Get(ctx, "a", clientv3.WithRev(100))), rpctypes.ErrFutureRev},
		{"empty key", second(c.Put(ctx, "", "x")), rpctypes.ErrEmptyKey},
		{"duplicate key in txn", second(c.Txn(ctx).Then(clientv3.OpPut("d", "1"), clientv3.OpPut("d", "2")).Commit()), rpctypes.ErrDuplicateKey},
		{"put inside deleted range", second(c.Txn(ctx).Then(clientv3.OpDelete("p", clientv3.WithPrefix()), clientv3.OpPut("p1", "2")).Commit()), rpctypes.ErrDuplicateKey},
		{"lease not found", second(c.Put(ctx, "l", "v", clientv3.WithLease(12345))), rpctypes.ErrLeaseNotFound},
		{"ignore value on missing key", second(c.Put(ctx, "missing", "", clientv3.WithIgnoreValue())), rpctypes.ErrKeyNotFound},
		{"request too large", second(c.Put(ctx, "big", strings.Repeat("x", 1536*1024+1))), rpctypes.ErrRequestTooLarge},
	}
	ops := make([]clientv3.Op, 129)
	for i := range ops {
		ops[i] = clientv3.OpPut(fmt.Sprintf("t%d", i), "v")
	}
	cases = append(cases, struct {
		name string
		err  error
		want error
	}{"too many ops", second(c.Txn(ctx).Then(ops...).Commit()), rpctypes.ErrTooManyOps})
	for _, tc := range cases {
		if !errors.Is(tc.err, tc.want) && (tc.err == nil || tc.err.Error() != tc.want.Error()) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	must(c.Compact(ctx, 3))
	if _, err := c.Get(ctx, "a", clientv3.WithRev(2)); err == nil || err.Error() != rpctypes.ErrCompacted.Error() {
		t.Errorf("read below compaction: %v", err)
	} else if ee, ok := err.(rpctypes.EtcdError); !ok || ee.Code() != codes.OutOfRange {
		t.Errorf("compacted error %#v, want code OutOfRange", err)
	}
	if _, err := c.Compact(ctx, 3); err == nil || err.Error() != rpctypes.ErrCompacted.Error() {
		t.Errorf("compact twice: %v", err)
	}
	if r := must(c.Get(ctx, "a", clientv3.WithRev(3))); string(r.Kvs[0].Value) != "2" {
		t.Errorf("read at compacted revision: %q", r.Kvs[0].Value)
	}
	if _, err := c.Cluster.MemberAdd(ctx, []string{"http://127.0.0.1:1"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("member add: %v", err)
	}
	if nothing := must(c.Get(ctx, "big")); len(nothing.Kvs) != 0 {
		t.Errorf("oversized put was written")
	}
}

func second[T any](_ T, err error) error { return err }

func TestTxnCompareTargets(t *testing.T) {
	c, ctx := setup(t)
	lease := must(c.Grant(ctx, 60))
	must(c.Put(ctx, "k", "v", clientv3.WithLease(lease.ID))) // rev 2
	must(c.Put(ctx, "k", "w", clientv3.WithIgnoreLease()))   // rev 3
	tests := []struct {
		cmp  clientv3.Cmp
		want bool
	}{
		{clientv3.Compare(clientv3.Value("k"), "=", "w"), true},
		{clientv3.Compare(clientv3.Value("k"), ">", "v"), true},
		{clientv3.Compare(clientv3.Version("k"), "=", 2), true},
		{clientv3.Compare(clientv3.CreateRevision("k"), "=", 2), true},
		{clientv3.Compare(clientv3.ModRevision("k"), "<", 4), true},
		{clientv3.Compare(clientv3.ModRevision("k"), "!=", 3), false},
		{clientv3.Compare(clientv3.LeaseValue("k"), "=", lease.ID), true},
		{clientv3.Compare(clientv3.Version("absent"), "=", 0), true},
		{clientv3.Compare(clientv3.Value("absent"), "=", ""), false},
		{clientv3.Compare(clientv3.ModRevision("absent"), "=", 0), true},
	}
	for i, tc := range tests {
		r := must(c.Txn(ctx).If(tc.cmp).Commit())
		if r.Succeeded != tc.want {
			t.Errorf("compare %d: succeeded=%v want %v", i, r.Succeeded, tc.want)
		}
	}
	// Nested transaction; the Range in the same branch sees the earlier put.
	r := must(c.Txn(ctx).If(clientv3.Compare(clientv3.Version("k"), "=", 2)).Then(
		clientv3.OpPut("n1", "a"),
		clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Version("n1"), "=", 0)}, []clientv3.Op{clientv3.OpPut("n2", "b")}, []clientv3.Op{clientv3.OpPut("n3", "c")}),
		clientv3.OpGet("n1"),
	).Commit())
	if !r.Succeeded {
		t.Fatal("outer compare failed")
	}
	nested := r.Responses[1].GetResponseTxn()
	if !nested.Succeeded {
		t.Error("nested compares must see the state before the transaction")
	}
	if got := r.Responses[2].GetResponseRange(); len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "a" {
		t.Errorf("range after put in the same txn: %+v", got.Kvs)
	}
	if g := must(c.Get(ctx, "n2")); len(g.Kvs) != 1 || g.Kvs[0].ModRevision != r.Header.Revision {
		t.Errorf("nested put: %+v", g.Kvs)
	}
}

// TestKubernetesShapedOps issues the exact requests kube-apiserver sends
// (see the compatibility notes: K6 create, K7 update, K8 delete, K9 compact).
func TestKubernetesShapedOps(t *testing.T) {
	c, ctx := setup(t)
	key := "/registry/pods/default/p"
	create := func() *clientv3.TxnResponse {
		return must(c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, "v1")).Commit())
	}
	r := create()
	if !r.Succeeded || must(c.Get(ctx, key)).Kvs[0].ModRevision != r.Header.Revision {
		t.Fatal("create: header revision must equal the new mod revision")
	}
	if create().Succeeded {
		t.Fatal("second create succeeded")
	}
	rev := r.Header.Revision
	upd := must(c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpPut(key, "v2")).Else(clientv3.OpGet(key)).Commit())
	if !upd.Succeeded {
		t.Fatal("update failed")
	}
	stale := must(c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpPut(key, "v3")).Else(clientv3.OpGet(key)).Commit())
	if stale.Succeeded || string(stale.Responses[0].GetResponseRange().Kvs[0].Value) != "v2" {
		t.Fatal("stale update must fail and return the current object")
	}
	del := must(c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", upd.Header.Revision)).Then(clientv3.OpDelete(key)).Else(clientv3.OpGet(key)).Commit())
	if !del.Succeeded || del.Responses[0].GetResponseDeleteRange().Deleted != 1 {
		t.Fatal("delete failed")
	}
	// Compactor: compare the version of compact_rev_key, then Compact.
	compactTxn := func(version int64, rev int64) *clientv3.TxnResponse {
		return must(c.Txn(ctx).If(clientv3.Compare(clientv3.Version("compact_rev_key"), "=", version)).
			Then(clientv3.OpPut("compact_rev_key", fmt.Sprint(rev))).Else(clientv3.OpGet("compact_rev_key")).Commit())
	}
	ct := compactTxn(0, 4)
	if !ct.Succeeded {
		t.Fatal("first compactor txn failed")
	}
	must(c.Compact(ctx, 4))
	lost := compactTxn(0, 5)
	if lost.Succeeded || lost.Responses[0].GetResponseRange().Kvs[0].Version != 1 {
		t.Fatal("compactor txn with stale version must fail and return version 1")
	}
	// Health probe on a missing key.
	if r := must(c.Get(ctx, "/registry/health")); len(r.Kvs) != 0 || r.Header.Revision <= 0 {
		t.Fatal("health probe")
	}
}

func TestWatchSemantics(t *testing.T) {
	c, ctx := setup(t)
	must(c.Put(ctx, "/w/a", "1")) // 2
	must(c.Put(ctx, "/w/b", "1")) // 3
	must(c.Put(ctx, "/x", "1"))   // 4
	must(c.Put(ctx, "/w/a", "2")) // 5
	must(c.Delete(ctx, "/w/b"))   // 6
	wch := c.Watch(ctx, "/w/", clientv3.WithPrefix(), clientv3.WithRev(2), clientv3.WithPrevKV())
	want := []struct {
		typ     mvccpb.Event_EventType
		key     string
		rev     int64
		create  bool
		prevVal string
	}{
		{mvccpb.PUT, "/w/a", 2, true, ""},
		{mvccpb.PUT, "/w/b", 3, true, ""},
		{mvccpb.PUT, "/w/a", 5, false, "1"},
		{mvccpb.DELETE, "/w/b", 6, false, "1"},
		{mvccpb.PUT, "/w/c", 8, true, ""},
	}
	must(c.Put(ctx, "/y", "1"))   // 7
	must(c.Put(ctx, "/w/c", "1")) // 8
	var got []*clientv3.Event
	for len(got) < len(want) {
		select {
		case wr := <-wch:
			if err := wr.Err(); err != nil {
				t.Fatal(err)
			}
			got = append(got, wr.Events...)
		case <-ctx.Done():
			t.Fatalf("timed out after %d events", len(got))
		}
	}
	for i, w := range want {
		ev := got[i]
		if ev.Type != w.typ || string(ev.Kv.Key) != w.key || ev.Kv.ModRevision != w.rev || ev.IsCreate() != w.create {
			t.Errorf("event %d: %v %q rev %d create %v; want %+v", i, ev.Type, ev.Kv.Key, ev.Kv.ModRevision, ev.IsCreate(), w)
		}
		if w.prevVal != "" && (ev.PrevKv == nil || string(ev.PrevKv.Value) != w.prevVal) {
			t.Errorf("event %d: prev kv %+v", i, ev.PrevKv)
		}
	}
	if len(got) > len(want) {
		t.Errorf("extra events: %d", len(got)-len(want))
	}
}

func TestWatchProgressAndCompaction(t *testing.T) {
	c, ctx := setup(t)
	must(c.Put(ctx, "a", "1"))
	wctx := clientv3.WithRequireLeader(ctx)
	wch := c.Watch(wctx, "zzz", clientv3.WithProgressNotify())
	// Periodic progress notification (interval 200ms in this setup).
	select {
	case wr := <-wch:
		if !wr.IsProgressNotify() || wr.Header.Revision != 2 {
			t.Fatalf("want progress notify at 2, got %+v", wr)
		}
	case <-ctx.Done():
		t.Fatal("no progress notification")
	}
	must(c.Put(ctx, "b", "1"))
	if err := c.RequestProgress(wctx); err != nil {
		t.Fatal(err)
	}
	for {
		wr := <-wch
		if wr.IsProgressNotify() && wr.Header.Revision == 3 {
			break
		}
		if wr.Err() != nil {
			t.Fatal(wr.Err())
		}
	}
	must(c.Put(ctx, "a", "2"))
	must(c.Compact(ctx, 4))
	old := c.Watch(ctx, "a", clientv3.WithRev(2))
	wr := <-old
	if wr.CompactRevision != 4 || !errors.Is(wr.Err(), rpctypes.ErrCompacted) {
		t.Fatalf("watch below compaction: compact=%d err=%v", wr.CompactRevision, wr.Err())
	}
}

func TestLeaseExpiryDeletesKeysWithEvents(t *testing.T) {
	c, ctx := setup(t)
	g := must(c.Grant(ctx, 1))
	if g.TTL != 2 {
		t.Fatalf("granted TTL %d, want etcd's minimum 2", g.TTL)
	}
	must(c.Put(ctx, "/masterleases/10.0.0.1", "ip", clientv3.WithLease(g.ID)))
	must(c.Put(ctx, "/masterleases/10.0.0.2", "ip", clientv3.WithLease(g.ID)))
	ttl := must(c.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys()))
	if len(ttl.Keys) != 2 || ttl.GrantedTTL != 2 || ttl.TTL <= 0 {
		t.Fatalf("time to live: %+v", ttl)
	}
	if l := must(c.Leases(ctx)); len(l.Leases) != 1 {
		t.Fatalf("leases: %+v", l.Leases)
	}
	wch := c.Watch(ctx, "/masterleases/", clientv3.WithPrefix(), clientv3.WithPrevKV())
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
	if r := must(c.TimeToLive(ctx, g.ID)); r.TTL != -1 {
		t.Fatalf("expired lease TTL %d, want -1", r.TTL)
	}
	// KeepAlive keeps a lease alive; Revoke deletes at once.
	g2 := must(c.Grant(ctx, 2))
	must(c.Put(ctx, "kept", "v", clientv3.WithLease(g2.ID)))
	for range 4 {
		if ka := must(c.KeepAliveOnce(ctx, g2.ID)); ka.TTL != 2 {
			t.Fatalf("keepalive TTL %d", ka.TTL)
		}
		time.Sleep(time.Second)
	}
	if r := must(c.Get(ctx, "kept")); len(r.Kvs) != 1 {
		t.Fatal("key of a kept-alive lease expired")
	}
	must(c.Revoke(ctx, g2.ID))
	if r := must(c.Get(ctx, "kept")); len(r.Kvs) != 0 {
		t.Fatal("revoke did not delete the key")
	}
	if _, err := c.Revoke(ctx, g2.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("revoke twice: %v", err)
	}
}

// TestContendedUpdatesNeverError runs many clients doing kube-apiserver's
// optimistic update loop on a few keys: every failed compare must come back
// as Succeeded=false, never an error, and every success must land.
func TestContendedUpdatesNeverError(t *testing.T) {
	c, ctx := setup(t)
	const keys, workers, rounds = 4, 24, 40
	for k := range keys {
		must(c.Put(ctx, fmt.Sprintf("c%d", k), "0"))
	}
	var mu sync.Mutex
	successes := 0
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("c%d", w%keys)
			for range rounds {
				g, err := c.Get(ctx, key)
				if err != nil {
					errs <- err
					return
				}
				kv := g.Kvs[0]
				r, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
					Then(clientv3.OpPut(key, fmt.Sprint(kv.Version))).Else(clientv3.OpGet(key)).Commit()
				if err != nil {
					errs <- err
					return
				}
				if r.Succeeded {
					mu.Lock()
					successes++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("contended update returned an error: %v", err)
	}
	total := int64(0)
	for k := range keys {
		total += must(c.Get(ctx, fmt.Sprintf("c%d", k))).Kvs[0].Version - 1
	}
	if total != int64(successes) {
		t.Fatalf("%d successful updates but versions moved by %d", successes, total)
	}
	if r := must(c.Get(ctx, "c0")); r.Header.Revision != int64(1+keys+successes) {
		t.Fatalf("revision %d, want dense %d", r.Header.Revision, 1+keys+successes)
	}
}

// TestAcknowledgedWritesVisibleToNextList is the check KubeBrain failed: a
// list issued right after acknowledged creates must contain all of them.
func TestAcknowledgedWritesVisibleToNextList(t *testing.T) {
	c, ctx := setup(t)
	const n = 400
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := i; j < n; j += 8 {
				key := fmt.Sprintf("/registry/events/%04d", j)
				r, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, "v")).Commit()
				if err != nil || !r.Succeeded {
					t.Errorf("create %s: %v", key, err)
					return
				}
				l, err := c.Get(ctx, "/registry/events/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
				if err != nil {
					t.Error(err)
					return
				}
				found := false
				for _, kv := range l.Kvs {
					if string(kv.Key) == key {
						found = true
					}
				}
				if !found {
					t.Errorf("acknowledged %s missing from the next list at revision %d", key, l.Header.Revision)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestRestartKeepsDataRevisionsLeasesAndWatchHistory(t *testing.T) {
	store := memkv.New()
	var leaseID clientv3.LeaseID
	{
		srv := servertest.Start(t, servertest.Options{Store: store})
		c := srv.Client(t)
		ctx := context.Background()
		must(c.Put(ctx, "a", "1"))
		must(c.Put(ctx, "a", "2"))
		leaseID = must(c.Grant(ctx, 3600)).ID
		must(c.Put(ctx, "b", "1", clientv3.WithLease(leaseID)))
		must(c.Delete(ctx, "a"))
		// Shut the first server down before the second one opens the store.
		srv.Stop()
	}
	srv := servertest.Start(t, servertest.Options{Store: store})
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := must(c.Get(ctx, "b"))
	if r.Header.Revision != 5 || r.Kvs[0].Lease != int64(leaseID) {
		t.Fatalf("after restart: rev %d kvs %+v", r.Header.Revision, r.Kvs)
	}
	if ttl := must(c.TimeToLive(ctx, leaseID, clientv3.WithAttachedKeys())); ttl.TTL <= 0 || len(ttl.Keys) != 1 {
		t.Fatalf("lease after restart: %+v", ttl)
	}
	if p := must(c.Put(ctx, "c", "1")); p.Header.Revision != 6 {
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

// TestWatchAtCompactedRevisionHasNoPrevKV matches etcd: the previous version
// of an event at exactly the compacted revision is compacted, so prev_kv is
// absent (kube-apiserver turns that into an error and relists), while the
// next event has it.
func TestWatchAtCompactedRevisionHasNoPrevKV(t *testing.T) {
	c, ctx := setup(t)
	must(c.Put(ctx, "k", "1")) // 2
	must(c.Put(ctx, "k", "2")) // 3
	must(c.Put(ctx, "k", "3")) // 4
	must(c.Compact(ctx, 3, clientv3.WithCompactPhysical()))
	wch := c.Watch(ctx, "k", clientv3.WithRev(3), clientv3.WithPrevKV())
	var evs []*clientv3.Event
	for len(evs) < 2 {
		wr := <-wch
		if err := wr.Err(); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, wr.Events...)
	}
	if evs[0].Kv.ModRevision != 3 || evs[0].PrevKv != nil {
		t.Errorf("event at the compacted revision: prev_kv %+v, want none", evs[0].PrevKv)
	}
	if evs[1].PrevKv == nil || string(evs[1].PrevKv.Value) != "2" {
		t.Errorf("event after the compacted revision: prev_kv %+v", evs[1].PrevKv)
	}
	// Deleted exactly at the compacted revision, then re-created.
	must(c.Delete(ctx, "k")) // 5
	must(c.Compact(ctx, 5, clientv3.WithCompactPhysical()))
	if r := must(c.Get(ctx, "k", clientv3.WithRev(5))); len(r.Kvs) != 0 {
		t.Errorf("key deleted at the compacted revision is readable there")
	}
	must(c.Put(ctx, "k", "new")) // 6
	must(c.Compact(ctx, 6, clientv3.WithCompactPhysical()))
	if r := must(c.Get(ctx, "k")); r.Kvs[0].CreateRevision != 6 || r.Kvs[0].Version != 1 {
		t.Errorf("re-created key: %+v", r.Kvs[0])
	}
}
