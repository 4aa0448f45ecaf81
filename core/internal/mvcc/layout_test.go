package mvcc

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/memkv"
)

// TestLayoutRecordsMatchWorkedExample checks that the exported record API
// writes exactly the bytes of the package doc's worked example, and reads
// back what it wrote: it is the same format, not a second one.
func TestLayoutRecordsMatchWorkedExample(t *testing.T) {
	v2 := Version{ModRev: 3, CreateRev: 2, Version: 2}
	rec := AppendVersion(nil, v2, []byte("v2"))
	if want := []byte{0x02, 0x00, 0x03, 0x02, 0x02, 0x00, 0x00, 'v', '2'}; !bytes.Equal(rec, want) {
		t.Fatalf("AppendVersion = % x, want % x", rec, want)
	}
	got, val, err := DecodeVersion(rec)
	if err != nil || got != v2 || string(val) != "v2" {
		t.Fatalf("DecodeVersion = %+v %q %v, want %+v \"v2\"", got, val, err, v2)
	}
	tomb := AppendVersion(nil, Version{ModRev: 4, Tombstone: true}, nil)
	if want := []byte{0x02, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00}; !bytes.Equal(tomb, want) {
		t.Fatalf("tombstone = % x, want % x", tomb, want)
	}
	// A record from before sub revisions were kept (format 01).
	if old, _, err := DecodeVersion([]byte{0x01, 0x00, 0x03, 0x02, 0x02, 0x00}); err != nil || old.Sub != SubUnknown {
		t.Fatalf("old record: %+v %v, want Sub %d", old, err, SubUnknown)
	}
	if _, _, err := DecodeVersion([]byte{0x07, 0x00}); !errors.Is(err, errBadRecord) {
		t.Fatalf("unknown format: %v, want errBadRecord", err)
	}

	del := []Change{{Deleted: true, Key: []byte("k"), PrevRev: 3}}
	log := AppendChanges(nil, del)
	if want := []byte{0x01, 0x01, 0x01, 0x01, 'k', 0x03}; !bytes.Equal(log, want) {
		t.Fatalf("AppendChanges = % x, want % x", log, want)
	}
	two := []Change{{Key: []byte("k"), Superseded: rec}, {Deleted: true, Key: []byte("k"), PrevRev: 2}}
	log = AppendChanges(nil, two)
	if !bytes.Equal(log, encodeChanges(two)) {
		t.Fatalf("AppendChanges disagrees with encodeChanges: % x", log)
	}
	if n, err := ChangeCount(log); n != 2 || err != nil {
		t.Fatalf("ChangeCount = %d %v, want 2", n, err)
	}
	back, err := DecodeChanges(log)
	if err != nil || len(back) != 2 || !bytes.Equal(back[0].Superseded, rec) || !back[1].Deleted || back[1].PrevRev != 2 {
		t.Fatalf("DecodeChanges = %+v %v, want %+v", back, err, two)
	}

	if c := CompactRecord(4, 4); !bytes.Equal(c.Key, coder.MetaKey(metaCompact)) || !bytes.Equal(c.Value, []byte{0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 4}) {
		t.Fatalf("CompactRecord = %q -> % x", c.Key, c.Value)
	}
	if ttl, err := decodeLease(LeaseRecord(30)); ttl != 30 || err != nil {
		t.Fatalf("LeaseRecord(30) decodes to %d %v", ttl, err)
	}
}

// TestImportRecordOpsGuardOpen checks that the import record written with
// ImportRecordOp makes Open refuse the store, and ClearImportRecordOp
// makes it servable again.
func TestImportRecordOpsGuardOpen(t *testing.T) {
	ctx := context.Background()
	s := memkv.New()
	op, err := ImportRecordOp(ImportRecord{Kind: "restore", Source: "snap.db", Applied: 7})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, []kv.Op{op}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, Options{Store: s}); !errors.Is(err, ErrImportUnfinished) {
		t.Fatalf("Open with an import record: %v, want ErrImportUnfinished", err)
	}
	if rec, err := ReadImportRecord(ctx, s); err != nil || rec == nil || rec.Applied != 7 {
		t.Fatalf("ReadImportRecord = %+v %v", rec, err)
	}
	if err := s.Commit(ctx, []kv.Op{ClearImportRecordOp()}); err != nil {
		t.Fatal(err)
	}
	open(t, s)
}

// TestPinHistory checks the revisions an export reads under, and that a
// closed store refuses the pin.
func TestPinHistory(t *testing.T) {
	ctx := context.Background()
	b := open(t, memkv.New())
	put(t, b, "k", "v1")
	rev := put(t, b, "k", "v2")
	if _, err := b.Compact(ctx, rev-1, true); err != nil {
		t.Fatal(err)
	}
	cur, compact, unpin, err := b.PinHistory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer unpin()
	if cur != rev || compact != rev-1 {
		t.Fatalf("PinHistory = %d, %d; want %d, %d", cur, compact, rev, rev-1)
	}
	if c, r, err := b.Revisions(ctx); c != cur || r != compact || err != nil {
		t.Fatalf("Revisions = %d, %d, %v", c, r, err)
	}
	if got := b.EtcdCompactRev(compact); got != compact {
		t.Fatalf("EtcdCompactRev(%d) = %d", compact, got)
	}
	if _, err := b.Records().Get(ctx, coder.RevisionKey([]byte("k"))); err != nil {
		t.Fatalf("Records().Get: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b.PinHistory(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("PinHistory after Close: %v, want ErrClosed", err)
	}
}
