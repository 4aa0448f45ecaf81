package etcdtest_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/internal/etcdtest"
)

// update regenerates the snapshot testdata from a live etcd:
//
//	go test ./internal/etcdtest -run TestGenerateSnapshots -update
var update = flag.Bool("update", false, "regenerate core/snapshot/testdata from a real etcd 3.6")

// The snapshots and their facts files, in core/snapshot/testdata.
var snapshots = []struct {
	name     string // file name without extension
	workload func(*writer)
}{
	{"etcd36-compacted", compactedWorkload},
	{"etcd36-plain", plainWorkload},
}

func testdataDir(t testing.TB) string {
	t.Helper()
	root, err := etcdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "core", "snapshot", "testdata")
}

// TestGenerateSnapshots runs each workload on a fresh etcd, records its
// facts and saves a snapshot with etcdctl, overwriting the testdata. Only
// with -update: the files are committed, and regenerating changes their
// bytes (member IDs, ports and the raft term end up in the snapshot).
func TestGenerateSnapshots(t *testing.T) {
	if !*update {
		t.Skip("regenerates testdata; run with -update")
	}
	dir := testdataDir(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range snapshots {
		t.Run(s.name, func(t *testing.T) {
			e := etcdtest.Start(t, etcdtest.Options{})
			cli := newClient(t, e)
			w := &writer{t: t, ctx: ctx(t), cli: cli, rnd: rand.New(rand.NewPCG(2379, uint64(len(s.name))))}
			s.workload(w)
			facts := collect(t, cli, e.Endpoint)
			facts.Workload = w.ops

			db := filepath.Join(dir, s.name+".db")
			if out, err := e.Etcdctl(t, "snapshot", "save", db); err != nil {
				t.Fatalf("snapshot save: %v\n%s", err, out)
			}
			// Nothing may have written since the facts were read; the
			// snapshot must show the same revision.
			if rev := currentRevision(t, cli); rev != facts.Revision {
				t.Fatalf("revision moved from %d to %d while saving", facts.Revision, rev)
			}
			if err := os.Chmod(db, 0o644); err != nil {
				t.Fatal(err)
			}
			facts.Snapshot = filepath.Base(db)
			facts.SnapshotSize, facts.SnapshotSHA256 = fileSum(t, db)
			facts.Status = snapshotStatus(t, db)
			if facts.CompactRevision > 0 {
				// What a restored etcd answers at the compact revision
				// (see SnapshotFacts.RestoredCompactHash).
				r := etcdtest.Start(t, etcdtest.Options{DataDir: etcdtest.Restore(t, db)})
				h := hashKV(t, newClient(t, r), r.Endpoint, facts.CompactRevision)
				facts.RestoredCompactHash = &h
			}

			b, err := json.MarshalIndent(facts, "", "\t")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, s.name+".json"), append(b, '\n'), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: revision %d, compact revision %d, %d bytes", db, facts.Revision, facts.CompactRevision, facts.SnapshotSize)
		})
	}
}

// TestSnapshotsRestore checks the committed testdata against etcd itself:
// etcdutl restores each snapshot, an etcd started on the restored
// directory must report what the facts file recorded before the snapshot
// was taken (revision, compact revision, HashKV and the keyspace at every
// revision, the watch history and the leases).
func TestSnapshotsRestore(t *testing.T) {
	if *update {
		t.Skip("regenerating")
	}
	etcdtest.Require(t)
	dir := testdataDir(t)
	for _, s := range snapshots {
		t.Run(s.name, func(t *testing.T) {
			want, err := etcdtest.LoadFacts(filepath.Join(dir, s.name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			db := filepath.Join(dir, want.Snapshot)
			if size, sum := fileSum(t, db); size != want.SnapshotSize || sum != want.SnapshotSHA256 {
				t.Fatalf("%s is %d bytes, sha256 %s; the facts are of %d bytes, sha256 %s", db, size, sum, want.SnapshotSize, want.SnapshotSHA256)
			}
			if got := snapshotStatus(t, db); got != want.Status {
				t.Errorf("snapshot status = %+v, want %+v", got, want.Status)
			}

			e := etcdtest.Start(t, etcdtest.Options{DataDir: etcdtest.Restore(t, db)})
			got := collect(t, newClient(t, e), e.Endpoint)
			wantHashes := want.Hashes
			if want.RestoredCompactHash != nil {
				// The live etcd answered at the compact revision from the
				// hash it kept in memory while compacting; a restored one
				// cannot (see SnapshotFacts.RestoredCompactHash).
				wantHashes = append([]etcdtest.HashKVFact{*want.RestoredCompactHash}, want.Hashes[1:]...)
			}
			if got.EtcdVersion != want.EtcdVersion {
				t.Errorf("etcd version %s, want %s", got.EtcdVersion, want.EtcdVersion)
			}
			for _, c := range []struct {
				what      string
				got, want any
			}{
				{"revision", got.Revision, want.Revision},
				{"compact revision", got.CompactRevision, want.CompactRevision},
				{"first revision", got.FirstRevision, want.FirstRevision},
				{"HashKV", got.Hashes, wantHashes},
				{"ranges", got.Ranges, want.Ranges},
				{"watch start", got.WatchFrom, want.WatchFrom},
				{"watch events", got.Events, want.Events},
				{"leases", got.Leases, want.Leases},
			} {
				if !reflect.DeepEqual(c.got, c.want) {
					t.Errorf("%s after restore differs:\n got %s\nwant %s", c.what, brief(c.got), brief(c.want))
				}
			}
		})
	}
}

// brief prints a value as JSON, cut short: enough to see how they differ.
func brief(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 2000 {
		return string(b[:2000]) + "..."
	}
	return string(b)
}

func newClient(t testing.TB, e *etcdtest.Etcd) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{e.Endpoint},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func fileSum(t testing.TB, path string) (int64, string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return int64(len(b)), hex.EncodeToString(sum[:])
}

func snapshotStatus(t testing.TB, db string) etcdtest.SnapshotStatus {
	t.Helper()
	out, err := etcdtest.Etcdutl(t, "snapshot", "status", db, "-w", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st etcdtest.SnapshotStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("snapshot status output %q: %v", out, err)
	}
	return st
}

func currentRevision(t testing.TB, cli *clientv3.Client) int64 {
	t.Helper()
	r, err := cli.Get(ctx(t), "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

// collect reads everything SnapshotFacts records (but the snapshot file's
// own fields and the workload) from a live etcd.
func collect(t testing.TB, cli *clientv3.Client, endpoint string) *etcdtest.SnapshotFacts {
	t.Helper()
	c := ctx(t)
	f := &etcdtest.SnapshotFacts{}
	st, err := cli.Status(c, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	f.EtcdVersion = st.Version
	f.Revision = currentRevision(t, cli)
	h, err := cli.HashKV(c, endpoint, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.CompactRevision = h.CompactRevision
	f.FirstRevision = max(f.CompactRevision, 1)
	for rev := f.FirstRevision; rev <= f.Revision; rev++ {
		f.Hashes = append(f.Hashes, hashKV(t, cli, endpoint, rev))
		r, err := cli.Get(c, "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev))
		if err != nil {
			t.Fatalf("Range at %d: %v", rev, err)
		}
		rf := etcdtest.RangeFact{Revision: rev, KVs: []etcdtest.KeyValue{}}
		for _, kv := range r.Kvs {
			rf.KVs = append(rf.KVs, keyValue(kv))
		}
		f.Ranges = append(f.Ranges, rf)
	}

	f.WatchFrom = max(f.CompactRevision+1, 1)
	f.Events = []etcdtest.EventFact{}
	if f.WatchFrom <= f.Revision {
		wc, cancel := context.WithCancel(c)
		defer cancel()
		// Without fragmenting, etcd never splits one revision's events
		// across responses, so the watch is complete once a response ends
		// at the current revision.
		ch := cli.Watch(wc, "\x00", clientv3.WithFromKey(), clientv3.WithRev(f.WatchFrom), clientv3.WithPrevKV())
	watch:
		for {
			select {
			case wr, ok := <-ch:
				if !ok {
					t.Fatalf("watch closed before revision %d (context: %v)", f.Revision, wc.Err())
				}
				if err := wr.Err(); err != nil {
					t.Fatalf("watch from %d: %v", f.WatchFrom, err)
				}
				for _, ev := range wr.Events {
					ef := etcdtest.EventFact{Type: ev.Type.String(), KV: keyValue(ev.Kv)}
					if ev.PrevKv != nil {
						p := keyValue(ev.PrevKv)
						ef.PrevKV = &p
					}
					f.Events = append(f.Events, ef)
				}
				if n := len(wr.Events); n > 0 && wr.Events[n-1].Kv.ModRevision >= f.Revision {
					break watch
				}
			case <-c.Done():
				t.Fatalf("watch from %d: no event at revision %d before the deadline", f.WatchFrom, f.Revision)
			}
		}
	}

	ls, err := cli.Leases(c)
	if err != nil {
		t.Fatal(err)
	}
	f.Leases = []etcdtest.LeaseFact{}
	for _, l := range ls.Leases {
		ttl, err := cli.TimeToLive(c, l.ID, clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatal(err)
		}
		keys := ttl.Keys
		// The lessor keeps a lease's keys in a map: sort for a stable file.
		slices.SortFunc(keys, bytes.Compare)
		f.Leases = append(f.Leases, etcdtest.LeaseFact{ID: int64(l.ID), GrantedTTL: ttl.GrantedTTL, Keys: keys})
	}
	slices.SortFunc(f.Leases, func(a, b etcdtest.LeaseFact) int { return cmp.Compare(a.ID, b.ID) })
	return f
}

func hashKV(t testing.TB, cli *clientv3.Client, endpoint string, rev int64) etcdtest.HashKVFact {
	t.Helper()
	h, err := cli.HashKV(ctx(t), endpoint, rev)
	if err != nil {
		t.Fatalf("HashKV(%d): %v", rev, err)
	}
	return etcdtest.HashKVFact{Revision: rev, Hash: h.Hash, CompactRevision: h.CompactRevision,
		HashRevision: h.HashRevision, HeaderRevision: h.Header.Revision}
}

func keyValue(kv *mvccpb.KeyValue) etcdtest.KeyValue {
	return etcdtest.KeyValue{Key: kv.Key, Value: kv.Value, CreateRevision: kv.CreateRevision,
		ModRevision: kv.ModRevision, Version: kv.Version, Lease: kv.Lease}
}

// writer runs a workload step by step and records the revision each
// step produced.
type writer struct {
	t   testing.TB
	ctx context.Context
	cli *clientv3.Client
	rnd *rand.Rand
	ops []etcdtest.WorkloadOp
}

func (w *writer) record(rev int64, format string, args ...any) int64 {
	w.ops = append(w.ops, etcdtest.WorkloadOp{Revision: rev, Op: fmt.Sprintf(format, args...)})
	return rev
}

// value returns a deterministic, object-like value of random length.
func (w *writer) value(key string) string {
	data := make([]byte, 8+w.rnd.IntN(56))
	for i := range data {
		data[i] = "0123456789abcdef"[w.rnd.IntN(16)]
	}
	return fmt.Sprintf(`{"key":%q,"data":"%s"}`, key, data)
}

func (w *writer) put(key string) int64 {
	w.t.Helper()
	return w.putValue(key, w.value(key), 0)
}

func (w *writer) putLease(key string, lease clientv3.LeaseID) int64 {
	w.t.Helper()
	return w.putValue(key, w.value(key), lease)
}

func (w *writer) putValue(key, value string, lease clientv3.LeaseID) int64 {
	w.t.Helper()
	r, err := w.cli.Put(w.ctx, key, value, clientv3.WithLease(lease))
	if err != nil {
		w.t.Fatalf("put %q: %v", key, err)
	}
	if lease != 0 {
		return w.record(r.Header.Revision, "put %q (%d bytes) with lease %#x", key, len(value), int64(lease))
	}
	return w.record(r.Header.Revision, "put %q (%d bytes)", key, len(value))
}

func (w *writer) del(key string, opts ...clientv3.OpOption) int64 {
	w.t.Helper()
	r, err := w.cli.Delete(w.ctx, key, opts...)
	if err != nil {
		w.t.Fatalf("delete %q: %v", key, err)
	}
	if r.Deleted == 0 {
		w.t.Fatalf("delete %q deleted nothing", key)
	}
	return w.record(r.Header.Revision, "delete %q (%d keys)", key, r.Deleted)
}

func (w *writer) txn(what string, cmps []clientv3.Cmp, ops ...clientv3.Op) int64 {
	w.t.Helper()
	r, err := w.cli.Txn(w.ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		w.t.Fatalf("txn %s: %v", what, err)
	}
	if !r.Succeeded {
		w.t.Fatalf("txn %s: conditions failed", what)
	}
	return w.record(r.Header.Revision, "txn: %s", what)
}

// grant grants a lease with a fixed ID, so the file's lease IDs (and the
// HashKV over keys carrying them) are the same on every regeneration;
// clientv3's Grant leaves the ID to etcd.
func (w *writer) grant(id, ttl int64) clientv3.LeaseID {
	w.t.Helper()
	r, err := pb.NewLeaseClient(w.cli.ActiveConnection()).LeaseGrant(w.ctx, &pb.LeaseGrantRequest{ID: id, TTL: ttl})
	if err != nil {
		w.t.Fatalf("grant lease %#x: %v", id, err)
	}
	if r.Error != "" {
		w.t.Fatalf("grant lease %#x: %s", id, r.Error)
	}
	w.record(0, "grant lease %#x, TTL %ds", id, ttl)
	return clientv3.LeaseID(id)
}

func (w *writer) revoke(id clientv3.LeaseID) int64 {
	w.t.Helper()
	r, err := w.cli.Revoke(w.ctx, id)
	if err != nil {
		w.t.Fatalf("revoke lease %#x: %v", id, err)
	}
	return w.record(r.Header.Revision, "revoke lease %#x (its keys are deleted)", int64(id))
}

func (w *writer) compact(rev int64) {
	w.t.Helper()
	if _, err := w.cli.Compact(w.ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		w.t.Fatalf("compact at %d: %v", rev, err)
	}
	w.record(0, "compact at %d (physical)", rev)
}

func pod(i int) string {
	return fmt.Sprintf("/registry/pods/%s/pod-%02d", []string{"default", "kube-system", "team-a"}[i%3], i)
}

const (
	svcPrefix = "/registry/services/specs/default/"
	cmPrefix  = "/registry/configmaps/kube-system/"
	// binaryKey has 0x00 (and bytes that are not UTF-8) in its name.
	binaryKey = "/registry/bin/\x00\x01\xfe\xff-key"
)

// compactedWorkload: history with transactions, deletes, leases, binary
// and empty values, a physical compaction at a revision that is itself a
// delete, and writes after it.
func compactedWorkload(w *writer) {
	for i := range 20 {
		w.put(pod(i))
	}
	w.put(pod(0))
	w.put(pod(1))
	w.put(pod(1))
	w.put(pod(5))
	w.txn("put 3 services", nil,
		clientv3.OpPut(svcPrefix+"svc-a", w.value("svc-a")),
		clientv3.OpPut(svcPrefix+"svc-b", w.value("svc-b")),
		clientv3.OpPut(svcPrefix+"svc-c", w.value("svc-c")))
	w.txn("put 4 configmaps", nil,
		clientv3.OpPut(cmPrefix+"cm-0", w.value("cm-0")),
		clientv3.OpPut(cmPrefix+"cm-1", w.value("cm-1")),
		clientv3.OpPut(cmPrefix+"cm-2", w.value("cm-2")),
		clientv3.OpPut(cmPrefix+"cm-3", w.value("cm-3")))
	w.txn("if pod-02 unchanged: update pod-02, put ev-1, delete pod-03 and pod-04",
		[]clientv3.Cmp{clientv3.Compare(clientv3.Version(pod(2)), "=", 1)},
		clientv3.OpPut(pod(2), w.value(pod(2))),
		clientv3.OpPut("/registry/events/default/ev-1", w.value("ev-1")),
		clientv3.OpDelete(pod(3)),
		clientv3.OpDelete(pod(4)))

	l1 := w.grant(0x1000, 600)
	l2 := w.grant(0x2000, 3600)
	l3 := w.grant(0x3000, 600)
	w.putLease("/registry/leases/kube-node-lease/node-1", l1)
	w.putLease("/registry/leases/kube-node-lease/node-2", l1)
	w.putLease("/registry/masterleases/10.0.0.1", l2)
	w.putLease("/registry/events/default/ev-2", l3)
	w.putLease("/registry/events/default/ev-3", l3)
	w.revoke(l3)

	w.putValue(binaryKey, "\x00\xff\x00binary\x00", 0)
	w.putValue("/registry/empty", "", 0)
	w.del(cmPrefix, clientv3.WithPrefix())
	w.put(cmPrefix + "cm-1")
	w.put(pod(6))
	// Compact at a delete: the tombstone at exactly the compact revision
	// is dropped by compaction and by HashKV.
	w.compact(w.del(pod(7)))

	w.put(pod(8))
	w.put(pod(9))
	w.put(svcPrefix + "svc-a")
	w.del(pod(10))
	w.put("/registry/deployments/default/web")
	w.txn("put api, update pod-11, delete pod-12", nil,
		clientv3.OpPut("/registry/deployments/default/api", w.value("api")),
		clientv3.OpPut(pod(11), w.value(pod(11))),
		clientv3.OpDelete(pod(12)))
	w.putValue(binaryKey, "\x00\x00second\xff", 0)
	w.putValue("/registry/empty", "", 0)
	w.del("/registry/masterleases/10.0.0.1")
	w.putLease("/registry/leases/kube-node-lease/node-1", l1)
	w.put(pod(7))
	w.put(pod(3))
	w.del("/registry/pods/team-a/", clientv3.WithPrefix())
	w.put("/registry/secrets/default/s1")
	w.put("/registry/secrets/default/s2")
	w.putLease("/registry/leases/kube-node-lease/node-3", l2)
	w.put(pod(0))
}

// plainWorkload: a fresh etcd, a few writes, never compacted.
func plainWorkload(w *writer) {
	w.put("/registry/namespaces/default")
	w.put("/registry/pods/default/a")
	w.put("/registry/pods/default/b")
	w.txn("put 3 configmaps", nil,
		clientv3.OpPut(cmPrefix+"x", w.value("x")),
		clientv3.OpPut(cmPrefix+"y", w.value("y")),
		clientv3.OpPut(cmPrefix+"z", w.value("z")))
	w.del("/registry/pods/default/a")
	w.put("/registry/pods/default/b")
}
