package backup_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/backup"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/mvcc/transfer"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/snapshot"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/engines/tikv/tikvmock"
	"github.com/engramkv/engram/internal/etcdtest"
	"github.com/engramkv/engram/wasm/host"
)

// engine opens a fresh, empty store of one kind for a test.
type engine struct {
	name string
	open func(t *testing.T) kv.Store
}

func repoFile(rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", rel)
}

// engines are the stores a restore must work on: the default embedded
// engine, a WebAssembly adaptor, the TiKV adaptor, and the in-memory one.
func engines() []engine {
	return []engine{
		{"memkv", func(t *testing.T) kv.Store {
			s := memkv.New()
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
		{"badger", func(t *testing.T) kv.Store {
			s, err := badger.Open(badger.Options{Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
		{"memkv.wasm", func(t *testing.T) kv.Store {
			path := repoFile("wasm/testplugins/bin/memkv.wasm")
			if _, err := os.Stat(path); err != nil {
				if os.Getenv("CI") == "" {
					t.Skipf("%s missing (make plugins); skipping", path)
				}
				t.Fatal(err)
			}
			p, err := host.Load(context.Background(), path, host.Options{CacheDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			s, err := p.Open(context.Background(), host.StoreOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
		{"tikv-mock", func(t *testing.T) kv.Store {
			s, err := tikvmock.Open(tikvmock.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
	}
}

func openBackend(t *testing.T, s kv.Store) *mvcc.Backend {
	t.Helper()
	b, err := mvcc.Open(context.Background(), mvcc.Options{Store: s, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func factKV(kv *mvccpb.KeyValue) etcdtest.KeyValue {
	return etcdtest.KeyValue{Key: kv.Key, Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version, Lease: kv.Lease}
}

func sameFact(a, b etcdtest.KeyValue) bool {
	return bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Value, b.Value) && a.CreateRevision == b.CreateRevision &&
		a.ModRevision == b.ModRevision && a.Version == b.Version && a.Lease == b.Lease
}

// TestRestoreEtcdSnapshots restores snapshots written by a real etcd 3.6
// (`etcdctl snapshot save`, kept in core/snapshot/testdata with what that
// etcd answered before saving them) into every engine and checks that the
// restored store answers as etcd did: the keyspace at every revision from
// the compacted one, HashKV at each (at exactly the compacted revision, as
// an etcd restored from the same file answers), the watch history from
// compacted+1 with prev_kv, and the leases with their keys.
func TestRestoreEtcdSnapshots(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"etcd36-compacted", "etcd36-plain"} {
		facts, err := etcdtest.LoadFacts(repoFile("core/snapshot/testdata/" + name + ".json"))
		if err != nil {
			t.Fatal(err)
		}
		file := repoFile("core/snapshot/testdata/" + facts.Snapshot)
		for _, eng := range engines() {
			t.Run(name+"/"+eng.name, func(t *testing.T) {
				store := eng.open(t)
				info, err := backup.Restore(ctx, store, file, backup.RestoreOptions{})
				if err != nil {
					t.Fatal(err)
				}
				b := openBackend(t, store)
				wantCompact := max(facts.CompactRevision, 0)
				if b.Rev() != facts.Revision || b.CompactRev() != wantCompact || info.Rev != facts.Revision {
					t.Fatalf("restored at revision %d compacted %d, etcd was at %d compacted %d", b.Rev(), b.CompactRev(), facts.Revision, wantCompact)
				}
				checkAgainstFacts(t, b, facts)
			})
		}
	}
}

func checkAgainstFacts(t *testing.T, b *mvcc.Backend, facts *etcdtest.SnapshotFacts) {
	t.Helper()
	ctx := context.Background()
	for rev := facts.FirstRevision; rev <= facts.Revision; rev++ {
		want, _ := facts.RangeAt(rev)
		resp, err := b.Range(ctx, &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev})
		if err != nil {
			t.Fatalf("range at %d: %v", rev, err)
		}
		if len(resp.Kvs) != len(want) {
			t.Fatalf("range at %d: %d keys, etcd had %d", rev, len(resp.Kvs), len(want))
		}
		for i, kv := range resp.Kvs {
			if !sameFact(factKV(kv), want[i]) {
				t.Fatalf("range at %d, key %d: %+v, etcd had %+v", rev, i, factKV(kv), want[i])
			}
		}
		wantHash, _ := facts.HashAt(rev)
		if rev == facts.CompactRevision && facts.RestoredCompactHash != nil {
			wantHash = *facts.RestoredCompactHash
		}
		h, err := transfer.HashKV(ctx, b, rev)
		if err != nil {
			t.Fatalf("HashKV at %d: %v", rev, err)
		}
		if h.Hash != wantHash.Hash || h.CompactRev != wantHash.CompactRevision || h.Rev != wantHash.HashRevision {
			t.Fatalf("HashKV at %d: hash %d compact %d revision %d, etcd said %d %d %d", rev, h.Hash, h.CompactRev, h.Rev, wantHash.Hash, wantHash.CompactRevision, wantHash.HashRevision)
		}
	}
	events, _, err := b.Events(ctx, facts.WatchFrom, facts.Revision, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != len(facts.Events) {
		t.Fatalf("%d events from %d, etcd sent %d", len(events), facts.WatchFrom, len(facts.Events))
	}
	for i, ev := range events {
		want := facts.Events[i]
		if ev.Type.String() != want.Type || !sameFact(factKV(ev.Kv), want.KV) || (ev.PrevKv == nil) != (want.PrevKV == nil) ||
			ev.PrevKv != nil && !sameFact(factKV(ev.PrevKv), *want.PrevKV) {
			t.Fatalf("event %d: %v, etcd sent %+v", i, ev, want)
		}
	}
	ids := b.Lessor().List()
	slices.Sort(ids)
	if len(ids) != len(facts.Leases) {
		t.Fatalf("leases %v, etcd had %d", ids, len(facts.Leases))
	}
	for i, l := range facts.Leases {
		info, err := b.Lessor().Lookup(l.ID)
		if err != nil || ids[i] != l.ID || info.TTL != l.GrantedTTL {
			t.Fatalf("lease %x: %+v %v, etcd had TTL %d", l.ID, info, err, l.GrantedTTL)
		}
		keys := b.Lessor().Keys(l.ID)
		slices.SortFunc(keys, bytes.Compare)
		if len(keys) != len(l.Keys) {
			t.Fatalf("lease %x holds %q, etcd had %q", l.ID, keys, l.Keys)
		}
		for j := range keys {
			if !bytes.Equal(keys[j], l.Keys[j]) {
				t.Fatalf("lease %x holds %q, etcd had %q", l.ID, keys, l.Keys)
			}
		}
	}
}

// TestRestoreBumpRevision restores an older backup under live clients as
// etcdutl's --bump-revision --mark-compacted does: the store resumes above
// every revision a client may hold, compacted there, with the data intact.
func TestRestoreBumpRevision(t *testing.T) {
	ctx := context.Background()
	facts, err := etcdtest.LoadFacts(repoFile("core/snapshot/testdata/etcd36-compacted.json"))
	if err != nil {
		t.Fatal(err)
	}
	file := repoFile("core/snapshot/testdata/" + facts.Snapshot)
	if _, err := backup.Restore(ctx, memkv.New(), file, backup.RestoreOptions{BumpRevision: 1000}); err == nil {
		t.Fatal("--bump-revision without --mark-compacted was accepted")
	}
	store := memkv.New()
	info, err := backup.Restore(ctx, store, file, backup.RestoreOptions{BumpRevision: 1000, MarkCompacted: true})
	if err != nil {
		t.Fatal(err)
	}
	b := openBackend(t, store)
	if b.Rev() != facts.Revision+1000 || b.CompactRev() != facts.Revision+1000 || info.Rev != b.Rev() {
		t.Fatalf("bumped restore at revision %d compacted %d, want both %d", b.Rev(), b.CompactRev(), facts.Revision+1000)
	}
	want, _ := facts.RangeAt(facts.Revision)
	resp, err := b.Range(ctx, &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}})
	if err != nil || len(resp.Kvs) != len(want) {
		t.Fatalf("keyspace after a bumped restore: %d keys (%v), want %d", len(resp.Kvs), err, len(want))
	}
	if _, err := b.Range(ctx, &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: facts.Revision}); !errors.Is(err, mvcc.ErrCompacted) {
		t.Fatalf("read at the backup's revision after a bump: %v, want compacted", err)
	}
	put, err := b.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte("v")})
	if err != nil || put.Header.Revision != facts.Revision+1001 {
		t.Fatalf("first write after a bumped restore: %v %v, want revision %d", put, err, facts.Revision+1001)
	}
}

// TestRestoreBadInput feeds Restore what it must refuse, each with its own
// clear error, and checks that nothing was written to the store.
func TestRestoreBadInput(t *testing.T) {
	ctx := context.Background()
	good := repoFile("core/snapshot/testdata/etcd36-compacted.db")
	raw, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	corrupt := bytes.Clone(raw)
	corrupt[len(corrupt)/2] ^= 0xff
	wrongHash := bytes.Clone(raw)
	wrongHash[len(wrongHash)-1] ^= 0x01
	noMeta := filepath.Join(dir, "nometa.db")
	db, err := bolt.Open(noMeta, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("key")); return err }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	cases := []struct {
		name string
		path string
		opts backup.RestoreOptions
		want error
	}{
		{"truncated", write("truncated.db", raw[:len(raw)/3]), backup.RestoreOptions{}, snapshot.ErrTruncated},
		{"corrupt page", write("corrupt.db", corrupt), backup.RestoreOptions{}, snapshot.ErrHashMismatch},
		{"wrong hash", write("wronghash.db", wrongHash), backup.RestoreOptions{}, snapshot.ErrHashMismatch},
		{"not bbolt", write("garbage.db", bytes.Repeat([]byte("not a database "), 4096)), backup.RestoreOptions{SkipHashCheck: true}, snapshot.ErrNotBolt},
		{"no trailer", noMeta, backup.RestoreOptions{}, snapshot.ErrNoTrailer},
		{"no meta bucket", noMeta, backup.RestoreOptions{SkipHashCheck: true}, snapshot.ErrNoMetaBucket},
		{"missing file", filepath.Join(dir, "absent.db"), backup.RestoreOptions{}, os.ErrNotExist},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store := memkv.New()
			_, err := backup.Restore(ctx, store, c.path, c.opts)
			if !errors.Is(err, c.want) {
				t.Fatalf("restore of %s: %v, want %v", c.name, err, c.want)
			}
			// Nothing half-applied: the store is still empty and
			// servable.
			b := openBackend(t, store)
			if b.Rev() != 1 {
				t.Fatalf("after a refused restore the store is at revision %d", b.Rev())
			}
		})
	}

	t.Run("non-empty target", func(t *testing.T) {
		store := memkv.New()
		b, err := mvcc.Open(ctx, mvcc.Options{Store: store})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Put(ctx, &pb.PutRequest{Key: []byte("precious"), Value: []byte("data")}); err != nil {
			t.Fatal(err)
		}
		b.Close()
		if _, err := backup.Restore(ctx, store, good, backup.RestoreOptions{}); !errors.Is(err, transfer.ErrNotEmpty) {
			t.Fatalf("restore into a store with data: %v, want ErrNotEmpty", err)
		}
		b = openBackend(t, store)
		resp, err := b.Range(ctx, &pb.RangeRequest{Key: []byte("precious")})
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "data" || b.Rev() != 2 {
			t.Fatalf("the store's data after a refused restore: %v %v at revision %d", resp, err, b.Rev())
		}
	})

	t.Run("interrupted restore is never served", func(t *testing.T) {
		mem := memkv.New()
		// The engine fails the restore's last commit (the one making the
		// store servable), as a crash or a full disk would.
		failing := &failLastCommits{Store: mem, okCommits: 2}
		if _, err := backup.Restore(ctx, failing, good, backup.RestoreOptions{}); err == nil {
			t.Fatal("a restore whose commit failed reported success")
		}
		if _, err := mvcc.Open(ctx, mvcc.Options{Store: mem}); !errors.Is(err, mvcc.ErrImportUnfinished) {
			t.Fatalf("opening a store whose restore stopped part-way: %v, want ErrImportUnfinished", err)
		}
		// Running the restore again wipes the partial one and completes.
		if _, err := backup.Restore(ctx, mem, good, backup.RestoreOptions{}); err != nil {
			t.Fatalf("restoring again after an interrupted restore: %v", err)
		}
		facts, err := etcdtest.LoadFacts(repoFile("core/snapshot/testdata/etcd36-compacted.json"))
		if err != nil {
			t.Fatal(err)
		}
		checkAgainstFacts(t, openBackend(t, mem), facts)
	})
}

// failLastCommits lets okCommits commits through and fails every later one.
type failLastCommits struct {
	kv.Store
	okCommits int
}

func (f *failLastCommits) Commit(ctx context.Context, ops []kv.Op) error {
	if f.okCommits == 0 {
		return errors.New("injected: disk full")
	}
	f.okCommits--
	return f.Store.Commit(ctx, ops)
}
