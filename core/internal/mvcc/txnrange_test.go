package mvcc

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/engines/memkv"
)

func rangeOpAt(key, end string, rev int64) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(key), RangeEnd: []byte(end), Revision: rev}}}
}

func putOp(key, value string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: []byte(value)}}}
}

func delOp(key, end string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(key), RangeEnd: []byte(end)}}}
}

func showKVs(kvs []*mvccpb.KeyValue) string {
	var parts []string
	for _, kv := range kvs {
		if kv == nil {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s=%s@c%d,m%d,v%d", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version))
	}
	return strings.Join(parts, " ")
}

// TestTxnRangeAtRevisionInGroup: a Range inside a transaction at a
// revision an earlier transaction of the same group wrote (not committed
// yet) reads that revision, not the latest state.
func TestTxnRangeAtRevisionInGroup(t *testing.T) {
	b := open(t, memkv.New())
	put(t, b, "a", "1") // 2
	put(t, b, "b", "1") // 3
	txns := []*pb.TxnRequest{
		{Success: []*pb.RequestOp{putOp("a", "2")}},                 // 4
		{Success: []*pb.RequestOp{delOp("a", ""), putOp("c", "1")}}, // 5
		{Success: []*pb.RequestOp{putOp("a", "3"),
			rangeOpAt("a", "", 3), rangeOpAt("a", "", 4), rangeOpAt("a", "", 5),
			rangeOpAt("a", "d", 4), rangeOpAt("a", "d", 5), rangeOpAt("a", "", 0)}}, // 6
	}
	// One group: the pipeline is held busy while the three are queued, so
	// the writer evaluates them into the group it opened with nothing in
	// flight (a quiet one, which may serve reads at its own revisions).
	reqs := make([]*request, len(txns))
	b.w.p.hold(true)
	for i, txn := range txns {
		reqs[i] = b.txnRequest(context.Background(), txn, false)
		reqs[i].ctx, reqs[i].done = context.Background(), make(chan struct{}, 1)
		b.reqs <- reqs[i]
	}
	for len(b.reqs) > 0 {
		runtime.Gosched() // the writer takes each one and evaluates it before looking again
	}
	b.w.p.hold(false)
	var last result
	for _, r := range reqs {
		<-r.done
		last = r.res
		if last.err != nil {
			t.Fatal(last.err)
		}
	}
	want := []string{
		"a=1@c2,m2,v1",
		"a=2@c2,m4,v2",
		"",
		"a=2@c2,m4,v2 b=1@c3,m3,v1",
		"b=1@c3,m3,v1 c=1@c5,m5,v1",
		"a=3@c6,m6,v1",
	}
	for i, w := range want {
		if got := showKVs(last.txn.Responses[i+1].GetResponseRange().Kvs); got != w {
			t.Errorf("range %d: got %q, want %q", i, got, w)
		}
	}
}

// TestKeyChangedTwiceInOneTxn: a transaction may change a key more than
// once (a delete and a put, a put and a delete); only the last version of
// its revision is readable, at every revision, through compaction, and the
// events replayed from the change log carry etcd's prev_kv (the version
// before the revision).
func TestKeyChangedTwiceInOneTxn(t *testing.T) {
	ctx := context.Background()
	b := open(t, memkv.New())
	txn := func(ops ...*pb.RequestOp) {
		t.Helper()
		if _, err := b.Txn(ctx, &pb.TxnRequest{Success: ops}); err != nil {
			t.Fatal(err)
		}
	}
	put(t, b, "k", "0")                                      // 2
	txn(delOp("k", ""), putOp("k", "1"))                     // 3: delete, then create again
	txn(putOp("k", "2"), delOp("k", "\x00"))                 // 4: put, then delete
	txn(delOp("j", "\x00"), putOp("k", "3"))                 // 5: a delete of nothing, then create
	txn(delOp("j", "\x00"), putOp("k", "4"), delOp("k", "")) // 6: delete, put, delete
	wantAt := map[int64]string{2: "k=0@c2,m2,v1", 3: "k=1@c3,m3,v1", 4: "", 5: "k=3@c5,m5,v1", 6: ""}
	check := func(stage string, from int64) {
		t.Helper()
		for rev := from; rev <= 6; rev++ {
			kv, err := get(t, b, "k", rev)
			if err != nil {
				t.Fatalf("%s: read at %d: %v", stage, rev, err)
			}
			if got := showKVs([]*mvccpb.KeyValue{kv}); got != wantAt[rev] {
				t.Errorf("%s: at %d got %q, want %q", stage, rev, got, wantAt[rev])
			}
		}
	}
	check("before compaction", 2)
	evs, _, err := b.Events(ctx, 3, 6, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		s := fmt.Sprintf("%s@%d prev=%s", ev.Type, ev.Kv.ModRevision, showKVs([]*mvccpb.KeyValue{ev.PrevKv}))
		if ev.Type == mvccpb.PUT {
			s += " " + showKVs([]*mvccpb.KeyValue{ev.Kv})
		}
		got = append(got, s)
	}
	want := []string{
		"DELETE@3 prev=k=0@c2,m2,v1", "PUT@3 prev= k=1@c3,m3,v1",
		"PUT@4 prev=k=1@c3,m3,v1 k=2@c3,m4,v2", "DELETE@4 prev=k=1@c3,m3,v1",
		"PUT@5 prev= k=3@c5,m5,v1",
		"DELETE@6 prev=k=3@c5,m5,v1", "PUT@6 prev= k=4@c6,m6,v1", "DELETE@6 prev=k=3@c5,m5,v1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, c := range []int64{3, 4, 5} {
		if _, err := b.Compact(ctx, c, true); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprint("compacted at ", c), c)
	}
}

// TestSupersededPutRoundTrip: a change that keeps a superseded put's
// version decodes back whole, and no truncation of it decodes.
func TestSupersededPutRoundTrip(t *testing.T) {
	v := encodeObject(Version{ModRev: 9, CreateRev: 4, Version: 3}, []byte("val"))
	cs := []Change{{Key: []byte("a"), PrevRev: 4, Superseded: v}, {Deleted: true, Key: []byte("a"), PrevRev: 4}}
	rec := encodeChanges(cs)
	got, err := decodeChanges(rec)
	if err != nil || len(got) != 2 || string(got[0].Superseded) != string(v) || got[0].Deleted || got[0].PrevRev != 4 || !got[1].Deleted || got[1].Superseded != nil {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for i := range len(rec) {
		if _, err := decodeChanges(rec[:i]); err == nil {
			t.Fatalf("truncated record of %d bytes decoded", i)
		}
	}
}
