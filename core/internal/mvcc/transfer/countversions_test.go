package transfer

import (
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/engines/memkv"
)

// TestImportCountVersions imports rows from a source that counts no
// versions (kine reports 0): refused by default, as etcd never reports a
// live key with version 0; with CountVersions each put counts on from the
// key's imported version, and a put after a delete starts again at 1.
func TestImportCountVersions(t *testing.T) {
	ctx := context.Background()
	row := func(main int64, key string, create int64, tombstone bool) *etcdfmt.Entry {
		e := &etcdfmt.Entry{Rev: etcdfmt.Revision{Main: main}, Tombstone: tombstone}
		e.KV = etcdfmt.KeyValue{Key: []byte(key), ModRevision: main}
		if !tombstone {
			e.KV.CreateRevision, e.KV.Value = create, []byte("v")
		}
		return e
	}

	strict, err := NewImporter(ctx, ImportOptions{Store: memkv.New(), Record: mvcc.ImportRecord{Kind: "migrate", Source: "kine"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := strict.Add(ctx, row(2, "a", 2, false)); err == nil {
		t.Fatal("a live row with version 0 was accepted without CountVersions")
	}

	store := memkv.New()
	im, err := NewImporter(ctx, ImportOptions{Store: store, Record: mvcc.ImportRecord{Kind: "migrate", Source: "kine"}, CountVersions: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []*etcdfmt.Entry{row(2, "a", 2, false), row(3, "a", 2, false), row(4, "b", 4, false), row(5, "a", 2, false),
		row(6, "b", 0, true), row(7, "b", 7, false)} {
		if err := im.Add(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := im.Finish(ctx, FinishOptions{Rev: 7}); err != nil {
		t.Fatal(err)
	}
	b := open(t, store)
	for _, c := range []struct {
		key     string
		rev     int64
		version int64
	}{{"a", 2, 1}, {"a", 3, 2}, {"a", 7, 3}, {"b", 4, 1}, {"b", 7, 1}} {
		kv, err := get(t, b, c.key, c.rev)
		if err != nil || kv == nil {
			t.Fatalf("%s at %d: %v, %v", c.key, c.rev, kv, err)
		}
		if kv.Version != c.version {
			t.Errorf("%s at %d: version %d, want %d", c.key, c.rev, kv.Version, c.version)
		}
	}
	if err := CheckEmpty(ctx, store); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("CheckEmpty of the imported store: %v, want ErrNotEmpty", err)
	}
	if err := CheckEmpty(ctx, memkv.New()); err != nil {
		t.Fatalf("CheckEmpty of an empty store: %v", err)
	}
}
