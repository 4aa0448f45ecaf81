package transfer

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/golang/protobuf/proto"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/engines/memkv"
)

// exportedRows lists an export's rows in revision order as
// "main/sub key value" ("main/sub key -" for a tombstone).
func exportedRows(t *testing.T, b *mvcc.Backend) []string {
	t.Helper()
	sorter := etcdfmt.NewSorter(t.TempDir(), 0)
	defer sorter.Close()
	if _, err := Export(context.Background(), b, 0, sorter.Add); err != nil {
		t.Fatal(err)
	}
	var rows []string
	err := sorter.Each(context.Background(), func(e *etcdfmt.Entry) error {
		v := "-"
		if !e.Tombstone {
			v = fmt.Sprintf("%s@c%d,v%d", e.KV.Value, e.KV.CreateRevision, e.KV.Version)
		}
		rows = append(rows, fmt.Sprintf("%d/%d %s %s", e.Rev.Main, e.Rev.Sub, e.KV.Key, v))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestExportSupersededVersions: the export holds every change of a
// transaction that changed a key twice under its own sub revision, as
// etcd's key bucket does; at the compacted revision it keeps only each
// key's first delete; and a copy made through the importer exports the
// same rows, hashes alike and replays the same events.
func TestExportSupersededVersions(t *testing.T) {
	ctx := context.Background()
	src := open(t, memkv.New())
	put(t, src, "a/x", "0") // 2
	put(t, src, "b/x", "0") // 3
	putOp := func(k, v string) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k), Value: []byte(v)}}}
	}
	delOp := func(k, end string) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(k), RangeEnd: []byte(end)}}}
	}
	for _, o := range [][]*pb.RequestOp{
		{putOp("a/x", "1"), delOp("a", "\x00")},                     // 4: deletes b/x too
		{delOp("b", "\x00"), putOp("b/x", "2"), delOp("b", "\x00")}, // 5: the first delete finds nothing
		{delOp("c", "\x00"), putOp("c/x", "3")},                     // 6
	} {
		if _, err := src.Txn(ctx, &pb.TxnRequest{Success: o}); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		"2/0 a/x 0@c2,v1", "3/0 b/x 0@c3,v1",
		"4/0 a/x 1@c2,v2", "4/1 a/x -", "4/2 b/x -",
		"5/0 b/x 2@c5,v1", "5/1 b/x -",
		"6/0 c/x 3@c6,v1",
	}
	check := func(what string, b *mvcc.Backend, want []string) {
		t.Helper()
		if got := exportedRows(t, b); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: export:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	check("never compacted", src, want)
	copyOf := func() *mvcc.Backend {
		s := memkv.New()
		transfer(t, src, s, nil)
		return open(t, s)
	}
	same := func(what string, dst *mvcc.Backend, from int64) {
		t.Helper()
		check(what+", copy", dst, exportedRows(t, src))
		sameHashesAndEvents(t, what, src, dst, from)
	}
	same("never compacted", copyOf(), 2)
	// Compacted at 5: of b/x only its delete at 5 stays, as etcd's
	// compaction keeps it, under its own sub revision also in a copy whose
	// change log at 5 holds only that delete; the versions superseded at
	// 4 are gone.
	if _, err := src.Compact(ctx, 5, true); err != nil {
		t.Fatal(err)
	}
	check("compacted at 5", src, []string{"5/1 b/x -", "6/0 c/x 3@c6,v1"})
	same("compacted at 5", copyOf(), 6)
}

// sameHashesAndEvents fails t unless copy dst of src answers HashKV at every
// revision from from on as src does and replays the same events from it.
func sameHashesAndEvents(t *testing.T, what string, src, dst *mvcc.Backend, from int64) {
	t.Helper()
	ctx := context.Background()
	for rev := from; rev <= src.Rev(); rev++ {
		ha, err := HashKV(ctx, src, rev)
		if err != nil {
			t.Fatal(err)
		}
		hb, err := HashKV(ctx, dst, rev)
		if err != nil {
			t.Fatal(err)
		}
		if ha != hb {
			t.Errorf("%s: HashKV at %d: original %+v, copy %+v", what, rev, ha, hb)
		}
	}
	ea, _, err := src.Events(ctx, from, src.Rev(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	eb, _, err := dst.Events(ctx, from, dst.Rev(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if len(ea) != len(eb) {
		t.Fatalf("%s: %d events from %d in the original, %d in the copy", what, len(ea), from, len(eb))
	}
	for i := range ea {
		if !proto.Equal(ea[i], eb[i]) {
			t.Errorf("%s: event %d:\noriginal %v\ncopy     %v", what, i, ea[i], eb[i])
		}
	}
}
