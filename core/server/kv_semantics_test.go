package server_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRevisionsAndKeyValueFields(t *testing.T) {
	t.Parallel()
	c, ctx := setup(t)
	if r := must(c.Get(ctx, "x"))(t); r.Header.Revision != 1 {
		t.Fatalf("fresh store at revision %d, want 1", r.Header.Revision)
	}
	must(c.Put(ctx, "k", "v1"))(t) // 2
	must(c.Put(ctx, "k", "v2"))(t) // 3
	if r := must(c.Delete(ctx, "nothing"))(t); r.Header.Revision != 3 || r.Deleted != 0 {
		t.Fatalf("deleting nothing moved the revision: %+v", r.Header)
	}
	kv := must(c.Get(ctx, "k"))(t).Kvs[0]
	if kv.CreateRevision != 2 || kv.ModRevision != 3 || kv.Version != 2 || string(kv.Value) != "v2" {
		t.Fatalf("after update: %+v", kv)
	}
	must(c.Delete(ctx, "k"))(t)     // 4
	must(c.Put(ctx, "k", "new"))(t) // 5
	kv = must(c.Get(ctx, "k"))(t).Kvs[0]
	if kv.CreateRevision != 5 || kv.ModRevision != 5 || kv.Version != 1 {
		t.Fatalf("re-create must reset create_revision and version: %+v", kv)
	}
	// A transaction writing two keys takes one revision.
	tr := must(c.Txn(ctx).Then(clientv3.OpPut("a", "1"), clientv3.OpPut("b", "2")).Commit())(t)
	if tr.Header.Revision != 6 {
		t.Fatalf("txn revision %d, want 6", tr.Header.Revision)
	}
	for _, k := range []string{"a", "b"} {
		if kv := must(c.Get(ctx, k))(t).Kvs[0]; kv.ModRevision != 6 {
			t.Fatalf("%s mod revision %d", k, kv.ModRevision)
		}
	}
	// A failed compare takes none.
	tr = must(c.Txn(ctx).If(clientv3.Compare(clientv3.Value("a"), "=", "nope")).Then(clientv3.OpPut("a", "x")).Commit())(t)
	if tr.Succeeded || tr.Header.Revision != 6 {
		t.Fatalf("failed compare: succeeded=%v rev=%d", tr.Succeeded, tr.Header.Revision)
	}
	// Reads at past revisions.
	if r := must(c.Get(ctx, "k", clientv3.WithRev(3)))(t); len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v2" {
		t.Fatalf("get at rev 3: %+v", r.Kvs)
	}
	if r := must(c.Get(ctx, "k", clientv3.WithRev(4)))(t); len(r.Kvs) != 0 {
		t.Fatalf("get at rev 4 (deleted): %+v", r.Kvs)
	}
	if r := must(c.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(5)))(t); r.Count != 1 || r.Header.Revision != 6 {
		t.Fatalf("range at rev 5: count %d header %d", r.Count, r.Header.Revision)
	}
}

func TestRangeOptions(t *testing.T) {
	t.Parallel()
	c, ctx := setup(t)
	for i := range 10 {
		must(c.Put(ctx, fmt.Sprintf("/r/%02d", i), fmt.Sprintf("v%d", 9-i)))(t)
	}
	must(c.Put(ctx, "/r", "parent"))(t)
	must(c.Put(ctx, "/s/0", "other"))(t)
	r := must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithLimit(3)))(t)
	if r.Count != 10 || len(r.Kvs) != 3 || !r.More || string(r.Kvs[0].Key) != "/r/00" {
		t.Fatalf("limit: count=%d len=%d more=%v", r.Count, len(r.Kvs), r.More)
	}
	// kube-apiserver continues from lastKey+"\x00".
	var keys []string
	from := "/r/"
	for {
		r := must(c.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd("/r/")), clientv3.WithLimit(4)))(t)
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
	if r := must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithCountOnly()))(t); r.Count != 10 || len(r.Kvs) != 0 {
		t.Fatalf("count only: %+v", r)
	}
	if r := must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithKeysOnly()))(t); len(r.Kvs) != 10 || r.Kvs[0].Value != nil {
		t.Fatalf("keys only returned values")
	}
	r = must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByValue, clientv3.SortAscend), clientv3.WithLimit(2)))(t)
	if string(r.Kvs[0].Value) != "v0" || string(r.Kvs[1].Value) != "v1" || !r.More {
		t.Fatalf("sort by value: %q %q", r.Kvs[0].Value, r.Kvs[1].Value)
	}
	r = must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend)))(t)
	if string(r.Kvs[0].Key) != "/r/09" {
		t.Fatalf("descending: %q", r.Kvs[0].Key)
	}
	r = must(c.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithMinModRev(5), clientv3.WithMaxModRev(6)))(t)
	if len(r.Kvs) != 2 {
		t.Fatalf("mod revision filter: %d kvs", len(r.Kvs))
	}
	r = must(c.Get(ctx, "/r/05", clientv3.WithFromKey()))(t)
	if r.Count != 6 { // /r/05../r/09 and /s/0
		t.Fatalf("from key: count %d", r.Count)
	}
	r = must(c.Get(ctx, "", clientv3.WithFromKey()))(t)
	if r.Count != 12 {
		t.Fatalf("whole keyspace: %d", r.Count)
	}
}

func TestErrorsMatchEtcd(t *testing.T) {
	t.Parallel()
	c, ctx := setup(t)
	must(c.Put(ctx, "a", "1"))(t)
	must(c.Put(ctx, "a", "2"))(t)
	must(c.Put(ctx, "a", "3"))(t)
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
	must(c.Compact(ctx, 3))(t)
	if _, err := c.Get(ctx, "a", clientv3.WithRev(2)); err == nil || err.Error() != rpctypes.ErrCompacted.Error() {
		t.Errorf("read below compaction: %v", err)
	} else if ee, ok := err.(rpctypes.EtcdError); !ok || ee.Code() != codes.OutOfRange {
		t.Errorf("compacted error %#v, want code OutOfRange", err)
	}
	if _, err := c.Compact(ctx, 3); err == nil || err.Error() != rpctypes.ErrCompacted.Error() {
		t.Errorf("compact twice: %v", err)
	}
	if r := must(c.Get(ctx, "a", clientv3.WithRev(3)))(t); string(r.Kvs[0].Value) != "2" {
		t.Errorf("read at compacted revision: %q", r.Kvs[0].Value)
	}
	if _, err := c.Cluster.MemberAdd(ctx, []string{"http://127.0.0.1:1"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("member add: %v", err)
	}
	if nothing := must(c.Get(ctx, "big"))(t); len(nothing.Kvs) != 0 {
		t.Errorf("oversized put was written")
	}
}

func TestTxnCompareTargets(t *testing.T) {
	t.Parallel()
	c, ctx := setup(t)
	lease := must(c.Grant(ctx, 60))(t)
	must(c.Put(ctx, "k", "v", clientv3.WithLease(lease.ID)))(t) // rev 2
	must(c.Put(ctx, "k", "w", clientv3.WithIgnoreLease()))(t)   // rev 3
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
		r := must(c.Txn(ctx).If(tc.cmp).Commit())(t)
		if r.Succeeded != tc.want {
			t.Errorf("compare %d: succeeded=%v want %v", i, r.Succeeded, tc.want)
		}
	}
	// Nested transaction; the Range in the same branch sees the earlier put.
	r := must(c.Txn(ctx).If(clientv3.Compare(clientv3.Version("k"), "=", 2)).Then(
		clientv3.OpPut("n1", "a"),
		clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Version("n1"), "=", 0)}, []clientv3.Op{clientv3.OpPut("n2", "b")}, []clientv3.Op{clientv3.OpPut("n3", "c")}),
		clientv3.OpGet("n1"),
	).Commit())(t)
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
	if g := must(c.Get(ctx, "n2"))(t); len(g.Kvs) != 1 || g.Kvs[0].ModRevision != r.Header.Revision {
		t.Errorf("nested put: %+v", g.Kvs)
	}
}

// TestKubernetesShapedOps issues the exact requests kube-apiserver sends
// (bench/README.md, "kube-apiserver's requests": K6 create, K7 update, K8 delete, K9 compact).
func TestKubernetesShapedOps(t *testing.T) {
	t.Parallel()
	c, ctx := setup(t)
	key := "/registry/pods/default/p"
	create := func() *clientv3.TxnResponse {
		return must(c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, "v1")).Commit())(t)
	}
	r := create()
	if !r.Succeeded || must(c.Get(ctx, key))(t).Kvs[0].ModRevision != r.Header.Revision {
		t.Fatal("create: header revision must equal the new mod revision")
	}
	if create().Succeeded {
		t.Fatal("second create succeeded")
	}
	rev := r.Header.Revision
	upd := must(c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpPut(key, "v2")).Else(clientv3.OpGet(key)).Commit())(t)
	if !upd.Succeeded {
		t.Fatal("update failed")
	}
	stale := must(c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpPut(key, "v3")).Else(clientv3.OpGet(key)).Commit())(t)
	if stale.Succeeded || string(stale.Responses[0].GetResponseRange().Kvs[0].Value) != "v2" {
		t.Fatal("stale update must fail and return the current object")
	}
	del := must(c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", upd.Header.Revision)).Then(clientv3.OpDelete(key)).Else(clientv3.OpGet(key)).Commit())(t)
	if !del.Succeeded || del.Responses[0].GetResponseDeleteRange().Deleted != 1 {
		t.Fatal("delete failed")
	}
	// Compactor: compare the version of compact_rev_key, then Compact.
	compactTxn := func(version int64, rev int64) *clientv3.TxnResponse {
		return must(c.Txn(ctx).If(clientv3.Compare(clientv3.Version("compact_rev_key"), "=", version)).
			Then(clientv3.OpPut("compact_rev_key", fmt.Sprint(rev))).Else(clientv3.OpGet("compact_rev_key")).Commit())(t)
	}
	ct := compactTxn(0, 4)
	if !ct.Succeeded {
		t.Fatal("first compactor txn failed")
	}
	must(c.Compact(ctx, 4))(t)
	lost := compactTxn(0, 5)
	if lost.Succeeded || lost.Responses[0].GetResponseRange().Kvs[0].Version != 1 {
		t.Fatal("compactor txn with stale version must fail and return version 1")
	}
	// Health probe on a missing key.
	if r := must(c.Get(ctx, "/registry/health"))(t); len(r.Kvs) != 0 || r.Header.Revision <= 0 {
		t.Fatal("health probe")
	}
}

// TestContendedUpdatesNeverError runs many clients doing kube-apiserver's
// optimistic update loop on a few keys: every failed compare must come back
// as Succeeded=false, never an error, and every success must land.
func TestContendedUpdatesNeverError(t *testing.T) {
	t.Parallel()
	c, ctx := setup(t)
	const keys, workers, rounds = 4, 24, 40
	for k := range keys {
		must(c.Put(ctx, fmt.Sprintf("c%d", k), "0"))(t)
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
		total += must(c.Get(ctx, fmt.Sprintf("c%d", k)))(t).Kvs[0].Version - 1
	}
	if total != int64(successes) {
		t.Fatalf("%d successful updates but versions moved by %d", successes, total)
	}
	if r := must(c.Get(ctx, "c0"))(t); r.Header.Revision != int64(1+keys+successes) {
		t.Fatalf("revision %d, want dense %d", r.Header.Revision, 1+keys+successes)
	}
}

// TestAcknowledgedWritesVisibleToNextList is the check KubeBrain failed: a
// list issued right after acknowledged creates must contain all of them.
func TestAcknowledgedWritesVisibleToNextList(t *testing.T) {
	t.Parallel()
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
