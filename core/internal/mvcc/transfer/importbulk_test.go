package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
	"github.com/engramkv/engram/engines/memkv"
)

// exported is a store's history as restore reads it from a file.
type exported struct {
	info    ExportInfo
	entries []etcdfmt.Entry
}

func export(t *testing.T, src *mvcc.Backend) exported {
	t.Helper()
	ctx := context.Background()
	sorter := etcdfmt.NewSorter(t.TempDir(), 0)
	defer sorter.Close()
	info, err := Export(ctx, src, 0, func(e *etcdfmt.Entry) error { return sorter.Add(e) })
	if err != nil {
		t.Fatal(err)
	}
	var x exported
	x.info = info
	err = sorter.Each(ctx, func(e *etcdfmt.Entry) error {
		c := *e
		c.KV.Key, c.KV.Value = bytes.Clone(e.KV.Key), bytes.Clone(e.KV.Value)
		x.entries = append(x.entries, c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func (x exported) bulkOptions(t *testing.T, dst kv.Store, loader kv.BulkLoader) BulkImportOptions {
	var leases []ImportLease
	for _, l := range x.info.Leases {
		leases = append(leases, ImportLease{ID: l.ID, TTL: l.TTL})
	}
	return BulkImportOptions{
		Store:  dst,
		Loader: loader,
		Record: mvcc.ImportRecord{Kind: "restore", Source: t.Name(), CompactRev: x.info.CompactRev},
		Leases: leases,
		Rows: func(yield func(*etcdfmt.Entry) error) error {
			for i := range x.entries {
				if err := yield(&x.entries[i]); err != nil {
					return err
				}
			}
			return nil
		},
		Finish:     FinishOptions{Rev: x.info.Rev, CompactRev: x.info.CompactRev},
		TempDir:    t.TempDir(),
		SortMemory: 4 << 10, // small: force runs on disk
	}
}

// dump returns every key and value of s.
func dump(t *testing.T, s kv.Store) []kv.Pair {
	t.Helper()
	var ps []kv.Pair
	if err := kv.ScanEach(context.Background(), s, kv.ScanOptions{}, func(p kv.Pair) error {
		ps = append(ps, p)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ps
}

func samePairs(t *testing.T, want, got []kv.Pair) {
	t.Helper()
	for i := 0; i < min(len(want), len(got)); i++ {
		if !bytes.Equal(want[i].Key, got[i].Key) || !bytes.Equal(want[i].Value, got[i].Value) {
			t.Fatalf("pair %d differs:\nimporter %q = %x\nbulk     %q = %x", i, want[i].Key, want[i].Value, got[i].Key, got[i].Value)
		}
	}
	if len(want) != len(got) {
		t.Fatalf("the importer wrote %d pairs, the bulk import %d", len(want), len(got))
	}
}

// TestBulkImportMatchesImporter checks the bulk path against the
// revision-by-revision one, byte for byte, on a history with sub
// revisions, deletes, re-creates, leases, a revoked lease and a
// compaction: the importer's layout is the reference.
func TestBulkImportMatchesImporter(t *testing.T) {
	ctx := context.Background()
	for _, seed := range []uint64{7, 11} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			src := open(t, memkv.New())
			churn(t, src, seed, 300)
			x := export(t, src)

			ref := memkv.New()
			transfer(t, src, ref, nil)
			bulk := memkv.New()
			n, err := BulkImport(ctx, x.bulkOptions(t, bulk, kv.BulkLoaderOf(bulk, 1<<10)))
			if err != nil {
				t.Fatal(err)
			}
			if n != int64(len(x.entries)) {
				t.Fatalf("bulk import reports %d rows of %d", n, len(x.entries))
			}
			samePairs(t, dump(t, ref), dump(t, bulk))
			dst := open(t, bulk)
			sameHashesAndEvents(t, "bulk import", src, dst, x.info.CompactRev)
		})
	}
}

// TestBulkImportRefuses: a store with data, or with another kind's
// unfinished import, is refused before anything is written.
func TestBulkImportRefuses(t *testing.T) {
	ctx := context.Background()
	src := open(t, memkv.New())
	churn(t, src, 3, 50)
	x := export(t, src)

	used := memkv.New()
	b := open(t, used)
	put(t, b, "/a", "1")
	before := dump(t, used)
	if _, err := BulkImport(ctx, x.bulkOptions(t, used, kv.BulkLoaderOf(used, 0))); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("bulk import into a used store: %v, want ErrNotEmpty", err)
	}
	samePairs(t, before, dump(t, used))

	migrating := memkv.New()
	if err := Unfinish(ctx, migrating, mvcc.ImportRecord{Kind: "migrate", Source: "etcd"}); err != nil {
		t.Fatal(err)
	}
	if _, err := BulkImport(ctx, x.bulkOptions(t, migrating, kv.BulkLoaderOf(migrating, 0))); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("bulk import over an unfinished migration: %v, want ErrNotEmpty", err)
	}
}

// TestBulkImportInterrupted: a load that fails part-way leaves a store
// that Open refuses, and the next restore replaces it.
func TestBulkImportInterrupted(t *testing.T) {
	ctx := context.Background()
	src := open(t, memkv.New())
	churn(t, src, 5, 200)
	x := export(t, src)

	base := memkv.New()
	faulty := kvfault.Wrap(base)
	boom := errors.New("disk on fire")
	// The marker, two batches, then the failure.
	faulty.FailCommits(kvfault.Fault{}, kvfault.Fault{}, kvfault.Fault{}, kvfault.Fault{Err: boom})
	if _, err := BulkImport(ctx, x.bulkOptions(t, faulty, kv.BulkLoaderOf(faulty, 1<<10))); !errors.Is(err, boom) {
		t.Fatalf("interrupted bulk import: %v, want the injected error", err)
	}
	if _, err := mvcc.Open(ctx, mvcc.Options{Store: base}); !errors.Is(err, mvcc.ErrImportUnfinished) {
		t.Fatalf("Open of a half-loaded store: %v, want mvcc.ErrImportUnfinished", err)
	}
	if _, err := BulkImport(ctx, x.bulkOptions(t, base, kv.BulkLoaderOf(base, 1<<10))); err != nil {
		t.Fatalf("restore over the interrupted one: %v", err)
	}
	sameHashesAndEvents(t, "after the interrupted import", src, open(t, base), x.info.CompactRev)
}

// TestBulkImportSameKeyTwiceInOneRevision covers what no etcd client can
// make but a file may hold: one revision changing a key twice (a put then
// a delete, a put then a put), whose superseded version only the change
// log keeps.
func TestBulkImportSameKeyTwiceInOneRevision(t *testing.T) {
	ctx := context.Background()
	kvAt := func(key string, main, create, version int64, value string) etcdfmt.KeyValue {
		return etcdfmt.KeyValue{Key: []byte(key), CreateRevision: create, ModRevision: main, Version: version, Value: []byte(value)}
	}
	entries := []etcdfmt.Entry{
		{Rev: etcdfmt.Revision{Main: 2}, KV: kvAt("/a", 2, 2, 1, "a1")},
		{Rev: etcdfmt.Revision{Main: 3}, KV: kvAt("/a", 3, 2, 2, "a2")},
		{Rev: etcdfmt.Revision{Main: 3, Sub: 1}, Tombstone: true, KV: etcdfmt.KeyValue{Key: []byte("/a"), ModRevision: 3}},
		{Rev: etcdfmt.Revision{Main: 4}, KV: kvAt("/b", 4, 4, 1, "b1")},
		{Rev: etcdfmt.Revision{Main: 4, Sub: 1}, KV: kvAt("/b", 4, 4, 2, "b2")},
		{Rev: etcdfmt.Revision{Main: 6}, KV: kvAt("/a", 6, 6, 1, "a3")},
	}
	x := exported{info: ExportInfo{Rev: 7}, entries: entries}

	ref := memkv.New()
	im, err := NewImporter(ctx, ImportOptions{Store: ref, Record: mvcc.ImportRecord{Kind: "restore", Source: t.Name()}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range entries {
		if err := im.Add(ctx, &entries[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := im.Finish(ctx, FinishOptions{Rev: 7}); err != nil {
		t.Fatal(err)
	}
	bulk := memkv.New()
	if _, err := BulkImport(ctx, x.bulkOptions(t, bulk, kv.BulkLoaderOf(bulk, 0))); err != nil {
		t.Fatal(err)
	}
	samePairs(t, dump(t, ref), dump(t, bulk))
}

// TestBulkImportEmpty: a snapshot of an empty etcd (revision 1, or a later
// revision with every key deleted and compacted away) restores to a store
// at that revision.
func TestBulkImportEmpty(t *testing.T) {
	ctx := context.Background()
	for _, rev := range []int64{1, 9} {
		x := exported{info: ExportInfo{Rev: rev, CompactRev: rev}}
		if rev == 1 {
			x.info.CompactRev = 0
		}
		s := memkv.New()
		if _, err := BulkImport(ctx, x.bulkOptions(t, s, kv.BulkLoaderOf(s, 0))); err != nil {
			t.Fatal(err)
		}
		b := open(t, s)
		if b.Rev() != rev {
			t.Fatalf("empty import to revision %d opens at %d", rev, b.Rev())
		}
		if r := put(t, b, "/first", "x"); r != rev+1 {
			t.Fatalf("first write after the import at revision %d, want %d", r, rev+1)
		}
	}
}
