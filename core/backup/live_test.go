package backup_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/core/backup"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/internal/etcdtest"
)

func dial(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// workload writes a seeded, Kubernetes-shaped history through a client:
// creates and updates, multi-key transactions (sub revisions above 0), a
// transaction that puts and deletes, prefix deletes, re-creates, keys on
// leases, a revoked lease, and a physical compaction in the middle whose
// revision is a delete. It returns the compacted revision.
func workload(t *testing.T, c *clientv3.Client, seed uint64) int64 {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 1))
	key := func() string { return fmt.Sprintf("/registry/pods/ns%d/pod-%02d", rng.IntN(3), rng.IntN(20)) }
	val := func() string { return fmt.Sprintf(`{"kind":"Pod","v":%d}`, rng.IntN(1<<20)) }
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	l1, err := c.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := c.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	l3, err := c.Grant(ctx, 900)
	if err != nil {
		t.Fatal(err)
	}
	must(c.Put(ctx, "/registry/leases/node-1", "a", clientv3.WithLease(l1.ID)))
	must(c.Put(ctx, "/registry/leases/node-2", "b", clientv3.WithLease(l1.ID)))
	must(c.Put(ctx, "/registry/leases/node-3", "c", clientv3.WithLease(l3.ID)))
	must(c.Put(ctx, "/registry/\x00binary\xff", "\x00\x01"))
	must(c.Put(ctx, "/registry/empty", ""))
	var compacted int64
	for i := range 120 {
		switch n := rng.IntN(10); {
		case n < 5:
			must(c.Put(ctx, key(), val()))
		case n < 7:
			seen := map[string]bool{}
			var ops []clientv3.Op
			for range 3 {
				k := key()
				if !seen[k] {
					seen[k] = true
					ops = append(ops, clientv3.OpPut(k, val()))
				}
			}
			if rng.IntN(2) == 0 {
				if k := key(); !seen[k] {
					ops = append(ops, clientv3.OpDelete(k))
				}
			}
			must(c.Txn(ctx).Then(ops...).Commit())
		case n < 8:
			must(c.Delete(ctx, fmt.Sprintf("/registry/pods/ns%d/pod-0", rng.IntN(3)), clientv3.WithPrefix()))
		case n < 9:
			must(c.Put(ctx, key(), val(), clientv3.WithLease(l2.ID)))
		default:
			must(c.Delete(ctx, key()))
		}
		if i == 60 {
			must(c.Revoke(ctx, l3.ID))
			// Compact at a delete's revision: etcd keeps that tombstone.
			d, err := c.Delete(ctx, "/registry/leases/node-2")
			if err != nil {
				t.Fatal(err)
			}
			compacted = d.Header.Revision
			must(c.Compact(ctx, compacted, clientv3.WithCompactPhysical()))
		}
	}
	return compacted
}

// compareStores checks that b answers like a from revision from to to: the
// keyspace at every revision, HashKV at each, the watch stream from from+1
// with prev_kv, and the leases with their TTLs and keys.
func compareStores(t *testing.T, a, b *clientv3.Client, from, to int64) {
	t.Helper()
	ctx := context.Background()
	for rev := from; rev <= to; rev++ {
		ra, err := a.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev))
		if err != nil {
			t.Fatalf("range at %d: %v", rev, err)
		}
		rb, err := b.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev))
		if err != nil {
			t.Fatalf("range at %d: %v", rev, err)
		}
		if !sameKVs(ra.Kvs, rb.Kvs) {
			t.Fatalf("range at %d differs:\n%v\n%v", rev, ra.Kvs, rb.Kvs)
		}
		if (rev-from)%7 != 1 && rev != to {
			// HashKV reads the whole history; every revision of the
			// etcd-made snapshots is hashed in TestRestoreEtcdSnapshots,
			// a sample suffices here.
			continue
		}
		if rev == from {
			// At exactly the compacted revision a live etcd answers
			// from the hash it kept while compacting (the history
			// before compaction, with the previous compact revision);
			// a restarted or restored etcd, and Engram, hash what
			// compaction kept. TestRestoreEtcdSnapshots checks the
			// latter against etcd.
			continue
		}
		ha, err := a.HashKV(ctx, a.Endpoints()[0], rev)
		if err != nil {
			t.Fatal(err)
		}
		hb, err := b.HashKV(ctx, b.Endpoints()[0], rev)
		if err != nil {
			t.Fatal(err)
		}
		if ha.Hash != hb.Hash || ha.CompactRevision != hb.CompactRevision || ha.HashRevision != hb.HashRevision {
			t.Fatalf("HashKV at %d: %d/%d/%d vs %d/%d/%d", rev, ha.Hash, ha.CompactRevision, ha.HashRevision, hb.Hash, hb.CompactRevision, hb.HashRevision)
		}
	}
	ea, eb := watchAll(t, a, from+1, to), watchAll(t, b, from+1, to)
	if len(ea) != len(eb) {
		t.Fatalf("watch from %d: %d events vs %d", from+1, len(ea), len(eb))
	}
	for i := range ea {
		if ea[i].Type != eb[i].Type || !sameKV(ea[i].Kv, eb[i].Kv) || (ea[i].PrevKv == nil) != (eb[i].PrevKv == nil) || ea[i].PrevKv != nil && !sameKV(ea[i].PrevKv, eb[i].PrevKv) {
			t.Fatalf("watch event %d: %v vs %v", i, ea[i], eb[i])
		}
	}
	la, lb := leases(t, a), leases(t, b)
	if fmt.Sprint(la) != fmt.Sprint(lb) {
		t.Fatalf("leases differ:\n%v\n%v", la, lb)
	}
}

func sameKV(a, b *mvccpb.KeyValue) bool {
	return bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Value, b.Value) && a.CreateRevision == b.CreateRevision &&
		a.ModRevision == b.ModRevision && a.Version == b.Version && a.Lease == b.Lease
}

func sameKVs(a, b []*mvccpb.KeyValue) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameKV(a[i], b[i]) {
			return false
		}
	}
	return true
}

// watchAll returns the events of the whole keyspace from from to to.
func watchAll(t *testing.T, c *clientv3.Client, from, to int64) []*clientv3.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []*clientv3.Event
	if from > to {
		return nil
	}
	for resp := range c.Watch(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(from), clientv3.WithPrevKV()) {
		if err := resp.Err(); err != nil {
			t.Fatalf("watch from %d: %v", from, err)
		}
		out = append(out, resp.Events...)
		if n := len(out); n > 0 && out[n-1].Kv.ModRevision >= to {
			return out
		}
	}
	t.Fatalf("watch from %d ended before revision %d", from, to)
	return nil
}

type leaseFact struct {
	ID, TTL int64
	Keys    []string
}

func leases(t *testing.T, c *clientv3.Client) []leaseFact {
	t.Helper()
	ctx := context.Background()
	ls, err := c.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []leaseFact
	for _, l := range ls.Leases {
		r, err := c.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatal(err)
		}
		f := leaseFact{ID: int64(l.ID), TTL: r.GrantedTTL}
		for _, k := range r.Keys {
			f.Keys = append(f.Keys, string(k))
		}
		// Neither etcd nor Engram promises an order here.
		slices.Sort(f.Keys)
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b leaseFact) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func currentRev(t *testing.T, c *clientv3.Client) int64 {
	t.Helper()
	r, err := c.Get(context.Background(), "\x00", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

func saveSnapshot(t *testing.T, c *clientv3.Client, path string) {
	t.Helper()
	rc, err := c.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestEtcdToEngram is the way in: a workload on a real etcd 3.6, its
// snapshot saved with etcdctl, restored into Engram on each engine, and the
// restored Engram checked against the live etcd as a client sees both.
func TestEtcdToEngram(t *testing.T) {
	etcd := etcdtest.Start(t, etcdtest.Options{})
	src := dial(t, etcd.Endpoint)
	compacted := workload(t, src, 1)
	rev := currentRev(t, src)
	file := filepath.Join(t.TempDir(), "etcd.db")
	if out, err := etcd.Etcdctl(t, "snapshot", "save", file); err != nil {
		t.Fatalf("etcdctl snapshot save: %v\n%s", err, out)
	}
	for _, eng := range engines() {
		t.Run(eng.name, func(t *testing.T) {
			store := eng.open(t)
			if _, err := backup.Restore(context.Background(), store, file, backup.RestoreOptions{}); err != nil {
				t.Fatal(err)
			}
			srv := servertest.Start(t, store, servertest.Options{})
			compareStores(t, src, srv.Client(t), compacted, rev)
		})
	}
}

// TestEngramToEtcd is the way out and back: Engram's snapshot saved with
// etcdctl, restored with etcdutl, and an etcd 3.6 started on it answering
// as Engram does; then that etcd's snapshot restored into Engram again.
func TestEngramToEtcd(t *testing.T) {
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	srv := servertest.Start(t, st, servertest.Options{})
	eng := srv.Client(t)
	compacted := workload(t, eng, 2)
	rev := currentRev(t, eng)

	file := filepath.Join(t.TempDir(), "engram.db")
	if out, err := etcdtest.Etcdctl(t, "--endpoints="+srv.Endpoint, "snapshot", "save", file); err != nil {
		t.Fatalf("etcdctl snapshot save against Engram: %v\n%s", err, out)
	}
	if out, err := etcdtest.Etcdutl(t, "snapshot", "status", file, "-w", "json"); err != nil {
		t.Fatalf("etcdutl snapshot status: %v\n%s", err, out)
	}
	etcd := etcdtest.Start(t, etcdtest.Options{DataDir: etcdtest.Restore(t, file)})
	back := dial(t, etcd.Endpoint)
	if got := currentRev(t, back); got != rev {
		t.Fatalf("etcd restored from Engram's snapshot is at revision %d, Engram at %d", got, rev)
	}
	compareStores(t, eng, back, compacted, rev)

	// And back again: etcd -> Engram.
	file2 := filepath.Join(t.TempDir(), "etcd.db")
	saveSnapshot(t, back, file2)
	again := eng2(t, file2)
	compareStores(t, eng, again, compacted, rev)
}

func eng2(t *testing.T, file string) *clientv3.Client {
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := backup.Restore(context.Background(), st, file, backup.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	return servertest.Start(t, st, servertest.Options{}).Client(t)
}
