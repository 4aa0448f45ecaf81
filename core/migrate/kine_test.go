package migrate_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/migrate"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/internal/kinetest"
	"github.com/engramkv/engram/internal/pgtest"
)

// k3sWriter writes to kine as kube-apiserver does (kine serves nothing
// else): creates, updates and deletes are transactions comparing the key's
// mod revision, events carry a lease, and the compactor's compact_rev_key
// transaction compares its version.
type k3sWriter struct {
	cli   *clientv3.Client
	lease clientv3.LeaseID

	mu   sync.Mutex
	mods map[string]int64 // live keys' mod revisions
}

// done records a write of key. kine's answer to a transaction may carry
// another revision than the row it wrote when writers run concurrently, so
// a live key's mod revision is read back (each key has one writer).
func (w *k3sWriter) done(ctx context.Context, key string, live bool) error {
	var mod int64
	if live {
		r, err := w.cli.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("read back %s: %w", key, err)
		}
		if len(r.Kvs) != 1 {
			return fmt.Errorf("read back %s: %d keys", key, len(r.Kvs))
		}
		mod = r.Kvs[0].ModRevision
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if live {
		w.mods[key] = mod
	} else {
		delete(w.mods, key)
	}
	return nil
}

func (w *k3sWriter) create(ctx context.Context, key, val string, lease clientv3.LeaseID) error {
	r, err := w.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, val, clientv3.WithLease(lease))).Commit()
	if err != nil {
		return fmt.Errorf("create %s: %w", key, err)
	}
	if !r.Succeeded {
		return fmt.Errorf("create %s: exists", key)
	}
	return w.done(ctx, key, true)
}

func (w *k3sWriter) update(ctx context.Context, key, val string) error {
	w.mu.Lock()
	mod := w.mods[key]
	w.mu.Unlock()
	r, err := w.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", mod)).
		Then(clientv3.OpPut(key, val)).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return fmt.Errorf("update %s: %w", key, err)
	}
	if !r.Succeeded {
		var cur []*mvccpb.KeyValue
		if len(r.Responses) > 0 && r.Responses[0].GetResponseRange() != nil {
			cur = r.Responses[0].GetResponseRange().Kvs
		}
		return fmt.Errorf("update %s: conflict at %d: %v", key, mod, cur)
	}
	return w.done(ctx, key, true)
}

func (w *k3sWriter) delete(ctx context.Context, key string) error {
	w.mu.Lock()
	mod := w.mods[key]
	w.mu.Unlock()
	r, err := w.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", mod)).
		Then(clientv3.OpDelete(key)).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	if !r.Succeeded {
		return fmt.Errorf("delete %s: conflict at %d", key, mod)
	}
	return w.done(ctx, key, false)
}

// compact is kube-apiserver's compactor step: it records the revision it
// compacted in compact_rev_key, guarded by the key's version.
func (w *k3sWriter) compact(ctx context.Context, version int64, rev int64) error {
	r, err := w.cli.Txn(ctx).If(clientv3.Compare(clientv3.Version("compact_rev_key"), "=", version)).
		Then(clientv3.OpPut("compact_rev_key", fmt.Sprint(rev))).Else(clientv3.OpGet("compact_rev_key")).Commit()
	if err != nil {
		return fmt.Errorf("compact_rev_key: %w", err)
	}
	if !r.Succeeded {
		return fmt.Errorf("compact_rev_key: version is not %d", version)
	}
	return nil
}

// k3sKey is the n-th object of a k3s cluster's keyspace.
func k3sKey(n int) string {
	kinds := []string{"pods/default", "configmaps/kube-system", "leases/kube-node-lease", "secrets/default", "events/default"}
	return fmt.Sprintf("/registry/%s/obj-%05d", kinds[n%len(kinds)], n)
}

// churn creates, updates and deletes k3s objects: n operations on keys
// first..first+keys.
func (w *k3sWriter) churn(ctx context.Context, rnd *rand.Rand, first, keys, n int) error {
	for range n {
		k := k3sKey(first + rnd.IntN(keys))
		w.mu.Lock()
		_, live := w.mods[k]
		w.mu.Unlock()
		val := fmt.Sprintf(`{"kind":"x","spec":%d}`, rnd.IntN(1e6))
		var err error
		switch {
		case !live:
			var lease clientv3.LeaseID
			if bytes.Contains([]byte(k), []byte("/events/")) {
				lease = w.lease
			}
			err = w.create(ctx, k, val, lease)
		case rnd.IntN(5) == 0:
			err = w.delete(ctx, k)
		default:
			err = w.update(ctx, k, val)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// TestMigrateFromKine migrates a kine on PostgreSQL holding a k3s-like
// keyspace (kine serves no Snapshot, no HashKV, no lease API, and counts no
// versions) while writers keep changing it, stops and resumes the
// migration, cuts over, and compares every
// key of the target with kine's at the final revision, the watch history
// from the base on, and what a client sees of leases and compact_rev_key.
func TestMigrateFromKine(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 2*time.Minute)
	pg := pgtest.Start(t)
	k := kinetest.Start(t, pg, kinetest.Options{})
	src := dial(t, k.Endpoint)
	grant, err := src.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	if grant.ID != 3600 {
		t.Fatalf("kine granted lease %d for a TTL of 3600; the migration takes kine's lease IDs as their TTLs", grant.ID)
	}
	w := &k3sWriter{cli: src, lease: grant.ID, mods: map[string]int64{}}
	rnd := rand.New(rand.NewPCG(26, 5))
	if err := w.churn(ctx, rnd, 0, 150, 400); err != nil {
		t.Fatal(err)
	}
	if err := w.compact(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}

	st := openBadger(t, "")
	opts := migrate.Options{Client: src, Source: k.Endpoint, Store: st, TempDir: t.TempDir(), PageSize: 50, LeaseSyncInterval: 200 * time.Millisecond}
	sourceRev := func() (int64, error) {
		r, err := src.Get(ctx, "\x00", clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return r.Header.Revision, nil
	}
	// A first run copies the base, follows some writes and is stopped.
	_, log1 := followUntil(t, ctx, opts, func() (int64, error) {
		if err := w.churn(ctx, rnd, 2000, 50, 60); err != nil {
			return 0, err
		}
		return sourceRev()
	})
	if !contains(log1, "serves no snapshot", "snapshot is not supported", "serves no lease API") {
		t.Fatalf("the migration did not say it fell back to a Range base and kine's leases:\n%s", log1)
	}
	requireUnservable(t, st)

	// A second run resumes, follows writers and cuts over.
	var logs logBuffer
	pl := newProgressLog(nil)
	cut := make(chan struct{})
	opts.Logger, opts.Progress = logs.logger(), pl.record
	ch := runAsync(ctx, opts, cut)
	if _, err := pl.waitFor(ctx, func(p migrate.Progress) bool { return p.Phase == "follow" }); err != nil {
		t.Fatalf("%v\nlog:\n%s", err, logs.String())
	}
	if !contains(logs.String(), "resuming migration") {
		t.Fatalf("the second run did not resume:\n%s", logs.String())
	}
	// Writers during the follow phase: new objects, and changes to the
	// base's, from three clients at once.
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- w.churn(ctx, rand.New(rand.NewPCG(uint64(i), 9)), 1000+i*100, 100, 150)
		}()
	}
	if err := w.update(ctx, k3sKey(0), "changed in follow"); err != nil && !contains(err.Error(), "conflict") {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.compact(ctx, 1, 2); err != nil {
		t.Fatal(err)
	}
	final, err := sourceRev()
	if err != nil {
		t.Fatal(err)
	}
	close(cut)
	r := waitRun(t, ch, time.Minute)
	if r.err != nil {
		t.Fatalf("migrate.Run: %v\nlog:\n%s", r.err, logs.String())
	}
	res := r.res
	t.Logf("result: %+v", res)
	if res.Base != migrate.BaseRange || res.Rev != final || res.CompactRev != res.BaseRev {
		t.Fatalf("result %+v, want a Range base compacted at its revision, resuming at %d", res, final)
	}
	if !contains(res.Verified, "serves no HashKV") {
		t.Fatalf("verified %q, want a key-by-key comparison", res.Verified)
	}

	srv := servertest.Start(t, st, servertest.Options{})
	eng := srv.Client(t)
	n := compareKine(t, ctx, src, eng, final)
	t.Logf("all %d keys match kine's at revision %d (base at %d)", n, final, res.BaseRev)

	// The history from the base on: the same events, as far as kine
	// reports them.
	want, err := collectWatch(ctx, src, "/registry/", res.BaseRev+1, final)
	if err != nil {
		t.Fatal(err)
	}
	got, err := collectWatch(ctx, eng, "/registry/", res.BaseRev+1, final)
	if err != nil {
		t.Fatal(err)
	}
	if err := diffEvents(kineComparable(want), kineComparable(got)); err != nil {
		t.Fatalf("watch from the base revision: %v", err)
	}
	t.Logf("%d watch events from revision %d match", len(want), res.BaseRev+1)

	// The apiserver's compactor reads compact_rev_key's version and value.
	a, err := src.Get(ctx, "compact_rev_key")
	if err != nil {
		t.Fatal(err)
	}
	b, err := eng.Get(ctx, "compact_rev_key")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Kvs) != 1 || len(b.Kvs) != 1 || a.Kvs[0].Version != b.Kvs[0].Version || !bytes.Equal(a.Kvs[0].Value, b.Kvs[0].Value) {
		t.Fatalf("compact_rev_key: kine %v, target %v", a.Kvs, b.Kvs)
	}
	// kine's lease is on the target with its TTL, and holds the events.
	ttl, err := eng.TimeToLive(ctx, grant.ID, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL != 3600 || len(ttl.Keys) == 0 {
		t.Fatalf("lease %d on the target: granted TTL %d, %d keys; want 3600 and the events", grant.ID, ttl.GrantedTTL, len(ttl.Keys))
	}
	// Writes continue on the target with versions counted on.
	before, err := eng.Get(ctx, k3sKey(1))
	if err != nil {
		t.Fatal(err)
	}
	put, err := eng.Put(ctx, k3sKey(1), "after the switch")
	if err != nil {
		t.Fatal(err)
	}
	after, err := eng.Get(ctx, k3sKey(1))
	if err != nil {
		t.Fatal(err)
	}
	if put.Header.Revision != final+1 || len(after.Kvs) != 1 || len(before.Kvs) == 1 && after.Kvs[0].Version != before.Kvs[0].Version+1 {
		t.Fatalf("a write after the switch: revision %d (want %d), %v after %v", put.Header.Revision, final+1, after.Kvs, before.Kvs)
	}
}

// compareKine compares every key of kine with the target's at rev and
// returns how many there are. kine lists its own compact_rev_key row
// beside the apiserver's under the same name; a client's Get answers the
// latter, listed last.
func compareKine(t *testing.T, ctx context.Context, src, eng *clientv3.Client, rev int64) int {
	t.Helper()
	a, err := src.Get(ctx, "\x01", clientv3.WithRange("\U0010FFFF"), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	b, err := eng.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	var kine []*mvccpb.KeyValue
	for _, kv := range a.Kvs {
		if n := len(kine); n > 0 && bytes.Equal(kine[n-1].Key, kv.Key) {
			kine[n-1] = kv
			continue
		}
		kine = append(kine, kv)
	}
	if len(kine) != len(b.Kvs) {
		t.Fatalf("kine has %d keys at %d, the target %d", len(kine), rev, len(b.Kvs))
	}
	for i, x := range kine {
		y := b.Kvs[i]
		if !bytes.Equal(x.Key, y.Key) || !bytes.Equal(x.Value, y.Value) || x.CreateRevision != y.CreateRevision || x.ModRevision != y.ModRevision || x.Lease != y.Lease ||
			y.Version < 1 || x.Version != 0 && x.Version != y.Version {
			t.Fatalf("key %d: kine %s, target %s", i, kvString(x), kvString(y))
		}
	}
	return len(kine)
}

// kineComparable drops from events what kine reports otherwise than etcd:
// versions (it counts none), the previous version's lease (kine's prev_kv
// carries the new version's lease; the target's is the previous one's),
// and a delete's create revision (kine's carries the deleted key's; etcd's
// and the target's is 0).
func kineComparable(evs []event) []event {
	out := make([]event, len(evs))
	for i, e := range evs {
		e.kv = kvCopy(e.kv)
		e.kv.Version = 0
		if e.typ == mvccpb.DELETE {
			e.kv.CreateRevision = 0
		}
		if e.prev != nil {
			e.prev = kvCopy(e.prev)
			e.prev.Version, e.prev.Lease = 0, 0
		}
		out[i] = e
	}
	return out
}

// TestMigrateFromFreshKine migrates a kine nothing has written to yet: it
// lists its own compact_rev_key row (at revision 1, where no etcd write can
// be) but answers nothing when the key is read, so the target holds no
// keys either, and the cut-over verifies.
func TestMigrateFromFreshKine(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, time.Minute)
	k := kinetest.Start(t, pgtest.Start(t), kinetest.Options{})
	src := dial(t, k.Endpoint)
	st := openBadger(t, "")
	var logs logBuffer
	res, err := migrate.Run(ctx, migrate.Options{Client: src, Source: k.Endpoint, Store: st, TempDir: t.TempDir(), Logger: logs.logger()}, closed())
	if err != nil {
		t.Fatalf("migrate.Run: %v\nlog:\n%s", err, logs.String())
	}
	if !contains(logs.String(), "leaving out a key", "compact_rev_key") {
		t.Fatalf("kine's own compact_rev_key row was not left out:\n%s", logs.String())
	}
	srv := servertest.Start(t, st, servertest.Options{})
	got, err := srv.Client(t).Get(ctx, "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	// kine writes its health key at start; that one is a key like any.
	health, err := src.Get(ctx, "/registry/health")
	if err != nil {
		t.Fatal(err)
	}
	compact, err := src.Get(ctx, "compact_rev_key")
	if err != nil {
		t.Fatal(err)
	}
	if len(compact.Kvs) != 0 || len(health.Kvs) != 1 || len(got.Kvs) != 1 {
		t.Fatalf("target keys %v after migrating a fresh kine; kine answers compact_rev_key %v, /registry/health %v", got.Kvs, compact.Kvs, health.Kvs)
	}
	if a, b := health.Kvs[0], got.Kvs[0]; !bytes.Equal(a.Key, b.Key) || !bytes.Equal(a.Value, b.Value) || a.CreateRevision != b.CreateRevision || a.ModRevision != b.ModRevision || b.Version != 1 {
		t.Fatalf("target keys %v after migrating a fresh kine; kine answers compact_rev_key %v, /registry/health %v", got.Kvs, compact.Kvs, health.Kvs)
	}
	t.Logf("result: %+v", res)
}
