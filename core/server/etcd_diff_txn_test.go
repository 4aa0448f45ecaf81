package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
)

// Differential tests of transactions: the headers inside a Txn, a Range at
// a revision inside one, the duplicate-key rule, the op limit with
// nesting, the revision bounds of a Range inside a Txn, and which error a
// put's checks give first.

// Building blocks for raw requests.

func opRange(key, end string, rev int64) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(key), RangeEnd: []byte(end), Revision: rev}}}
}

func opPut(key, value string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: []byte(value), PrevKv: true}}}
}

func opDel(key, end string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(key), RangeEnd: []byte(end), PrevKv: true}}}
}

func opTxn(cmp []*pb.Compare, then, els []*pb.RequestOp) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Compare: cmp, Success: then, Failure: els}}}
}

func ops(o ...*pb.RequestOp) []*pb.RequestOp { return o }

// cmpExists holds when key exists.
func cmpExists(key string) []*pb.Compare {
	return []*pb.Compare{{Key: []byte(key), Target: pb.Compare_CREATE, Result: pb.Compare_GREATER, TargetUnion: &pb.Compare_CreateRevision{CreateRevision: 0}}}
}

// showTxnAll shows everything a Txn answers, recursively, but the
// cluster's identity in the transaction's own header (cluster and member
// ID, raft term). The headers inside are shown whole: etcd leaves their
// identity unset.
func showTxnAll(r *pb.TxnResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "revision=%d ", r.Header.Revision)
	writeTxnBody(&b, r)
	return b.String()
}

func writeTxnBody(b *strings.Builder, r *pb.TxnResponse) {
	fmt.Fprintf(b, "succeeded=%v [", r.Succeeded)
	for _, op := range r.Responses {
		switch x := op.Response.(type) {
		case *pb.ResponseOp_ResponseRange:
			rr := x.ResponseRange
			fmt.Fprintf(b, " range{%s count=%d more=%v kvs=%s}", showInnerHeader(rr.Header), rr.Count, rr.More, showKVs(rr.Kvs))
		case *pb.ResponseOp_ResponsePut:
			pr := x.ResponsePut
			fmt.Fprintf(b, " put{%s prev=%s}", showInnerHeader(pr.Header), showKVs([]*mvccpb.KeyValue{pr.PrevKv}))
		case *pb.ResponseOp_ResponseDeleteRange:
			dr := x.ResponseDeleteRange
			fmt.Fprintf(b, " delete{%s deleted=%d prev=%s}", showInnerHeader(dr.Header), dr.Deleted, showKVs(dr.PrevKvs))
		case *pb.ResponseOp_ResponseTxn:
			fmt.Fprintf(b, " txn{%s ", showInnerHeader(x.ResponseTxn.Header))
			writeTxnBody(b, x.ResponseTxn)
			b.WriteString("}")
		default:
			fmt.Fprintf(b, " %T", op.Response)
		}
	}
	b.WriteString(" ]")
}

func showInnerHeader(h *pb.ResponseHeader) string {
	if h == nil {
		return "header=nil"
	}
	return fmt.Sprintf("header={cluster=%d member=%d revision=%d term=%d}", h.ClusterId, h.MemberId, h.Revision, h.RaftTerm)
}

func showKVs(kvs []*mvccpb.KeyValue) string {
	var parts []string
	for _, kv := range kvs {
		if kv == nil {
			parts = append(parts, "nil")
			continue
		}
		parts = append(parts, fmt.Sprintf("%q=%q@c%d,m%d,v%d,l%d", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// txn sends t to both servers and compares the whole answers.
func (p *pair) txn(t *testing.T, ctx context.Context, what string, txn *pb.TxnRequest) {
	t.Helper()
	same(t, p, what, func(i int) (*pb.TxnResponse, error) { return p.kv[i].Txn(ctx, txn) }, showTxnAll)
}

// ops sends a Txn of the given ops (no compares) to both servers.
func (p *pair) ops(t *testing.T, ctx context.Context, what string, o ...*pb.RequestOp) {
	t.Helper()
	p.txn(t, ctx, what, &pb.TxnRequest{Success: o})
}

// everything compares a Range of every key at rev (0: current).
func (p *pair) everything(t *testing.T, ctx context.Context, what string, rev int64) {
	t.Helper()
	same(t, p, what, func(i int) (*pb.RangeResponse, error) {
		return p.kv[i].Range(ctx, &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev})
	}, func(r *pb.RangeResponse) string {
		return fmt.Sprintf("revision=%d count=%d kvs=%s", r.Header.Revision, r.Count, showKVs(r.Kvs))
	})
}

// TestDiffTxnOpHeaders: the header of each response inside a Txn is the
// revision the transaction had reached when the op ran: a delete
// of nothing or a range before any change sees the revision before the
// transaction, a put the one being written, a nested transaction's header
// is empty; none carries the cluster's identity.
func TestDiffTxnOpHeaders(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	p.ops(t, ctx, "seed", opPut("a", "1"), opPut("b", "1"))
	p.ops(t, ctx, "delete nothing, put, nested, put",
		opDel("missing", ""), opPut("c", "1"),
		opTxn(nil, ops(opRange("a", "", 0), opDel("missing", ""), opPut("d", "1")), nil),
		opPut("e", "1"))
	p.ops(t, ctx, "range, delete, range, nested range", opRange("a", "z", 0), opDel("a", ""), opRange("a", "z", 0),
		opTxn(cmpExists("a"), nil, ops(opRange("b", "", 0))))
	p.ops(t, ctx, "nested first, changes nothing", opTxn(nil, ops(opDel("missing", ""), opRange("b", "", 0)), nil), opRange("b", "", 0))
	p.ops(t, ctx, "read only", opRange("b", "", 0), opTxn(nil, ops(opRange("c", "", 0)), nil))
	p.ops(t, ctx, "nested write, then outer ops", opTxn(nil, ops(opPut("f", "1")), nil), opDel("missing", ""), opRange("f", "", 0))
}

// TestDiffTxnRangeAtRevision: a Range at an explicit revision inside a
// write Txn reads that revision, not the transaction's own writes,
// whether the revision is an old one or the one before the transaction; a
// revision above that is a future one, the one being written included.
func TestDiffTxnRangeAtRevision(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	for n := range 6 {
		p.ops(t, ctx, "seed", opPut("foo", fmt.Sprint(n)), opPut(fmt.Sprint("k", n), "v"))
	}
	// The current revision is 7.
	p.ops(t, ctx, "put, delete, range at 7", opPut("foo", "new"), opDel("foo", ""), opRange("foo", "", 7))
	p.ops(t, ctx, "put, range at 5, range of all at 3",
		opPut("foo", "again"), opRange("foo", "", 5), opRange("foo", "\x00", 3), opRange("k", "l", 4))
	p.ops(t, ctx, "delete range, range at the revision before", opDel("k", "l"), opRange("k", "l", 9), opRange("k", "l", 0))
	p.ops(t, ctx, "range at the revision being written", opPut("x", "1"), opRange("x", "", 11))
	p.ops(t, ctx, "range at the current revision, nothing written yet", opRange("foo", "", 10), opPut("foo", "later"), opRange("foo", "", 10))
	p.everything(t, ctx, "everything", 0)
}

// TestDiffTxnDuplicateKeyRule: etcd's duplicate-key rule reads a delete's
// range end literally and checks nested transactions in order; a
// transaction it accepts that writes a key twice applies its ops in order,
// and the reads, the history and the watch events after it are etcd's.
func TestDiffTxnDuplicateKeyRule(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	p.ops(t, ctx, "seed", opPut("foo", "0"), opPut("foo/bar", "0"), opPut("foo/baz", "0"), opPut("other", "0"))
	w := p.watchStreams(t, ctx)
	w.exchange(t, p, "watch everything", createWatch(&pb.WatchCreateRequest{Key: []byte{0}, RangeEnd: []byte{0}, PrevKv: true}))
	steps := []struct {
		what string
		txn  *pb.TxnRequest
	}{
		{"put then from-key delete", &pb.TxnRequest{Success: ops(opPut("foo/bar", "1"), opDel("foo", "\x00"))}},
		{"nested: then deletes, else puts", &pb.TxnRequest{Success: ops(opTxn(cmpExists("foo/baz"), ops(opDel("foo/baz", "")), ops(opPut("foo/baz", "2"))))}},
		{"from-key delete then put", &pb.TxnRequest{Success: ops(opDel("other", "\x00"), opPut("other/x", "3"))}},
		{"delete, put, delete", &pb.TxnRequest{Success: ops(opDel("other", "\x00"), opPut("other/x", "4"), opDel("other", "\x00"))}},
		{"nested put, later nested delete", &pb.TxnRequest{Success: ops(opTxn(nil, ops(opPut("n", "5")), nil), opTxn(nil, ops(opDel("n", "")), nil))}},
		{"nested delete, later nested put", &pb.TxnRequest{Success: ops(opTxn(nil, ops(opDel("n", "")), nil), opTxn(nil, ops(opPut("n", "6")), nil))}},
		{"nested delete, outer put", &pb.TxnRequest{Success: ops(opTxn(nil, ops(opDel("n", "")), nil), opPut("n", "6"))}},
		{"put inside a delete range", &pb.TxnRequest{Success: ops(opDel("a", "z"), opPut("m", "7"))}},
		{"inverted delete range", &pb.TxnRequest{Success: ops(opPut("m", "8"), opDel("z", "a"))}},
		{"put, then delete of the key alone", &pb.TxnRequest{Success: ops(opPut("m", "9"), opDel("m", ""))}},
		{"same put in then and else", &pb.TxnRequest{Success: ops(opTxn(nil, ops(opPut("m", "10")), ops(opPut("m", "11"))))}},
		{"nested else put equal to an earlier nested put", &pb.TxnRequest{Success: ops(opTxn(nil, ops(opPut("m", "12")), nil), opTxn(nil, nil, ops(opPut("m", "13"))))}},
		{"failure branch", &pb.TxnRequest{Compare: cmpExists("nothing"), Failure: ops(opPut("r", "14"), opDel("r", "\x00"), opRange("a", "\x00", 0))}},
	}
	for _, s := range steps {
		p.txn(t, ctx, s.what, s.txn)
	}
	// The live events of every accepted write, in order.
	for range 8 {
		same(t, p, "event", func(i int) (*pb.WatchResponse, error) { return w[i].Recv() }, showEvents)
	}
	rev := int64(0)
	same(t, p, "revision", func(i int) (*pb.RangeResponse, error) {
		return p.kv[i].Range(ctx, &pb.RangeRequest{Key: []byte("x")})
	}, func(r *pb.RangeResponse) string { rev = r.Header.Revision; return fmt.Sprint(rev) })
	for r := int64(1); r <= rev; r++ {
		p.everything(t, ctx, fmt.Sprint("everything at ", r), r)
	}
}

func showEvents(r *pb.WatchResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "revision=%d", r.Header.Revision)
	for _, e := range r.Events {
		fmt.Fprintf(&b, " %s %s prev=%s", e.Type, showKVs([]*mvccpb.KeyValue{e.Kv}), showKVs([]*mvccpb.KeyValue{e.PrevKv}))
	}
	return b.String()
}

// TestDiffTxnNestedOpLimit: a nested transaction may be only as wide as
// its parent's widest list left of the limit.
func TestDiffTxnNestedOpLimit(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	ranges := func(n int) []*pb.RequestOp {
		var o []*pb.RequestOp
		for range n {
			o = append(o, opRange("a", "", 0))
		}
		return o
	}
	for _, c := range []struct{ outer, inner int }{{1, 128}, {1, 126}, {1, 127}, {0, 127}, {0, 128}, {3, 124}, {3, 125}} {
		o := append(ranges(c.outer), opTxn(nil, ranges(c.inner), nil))
		p.ops(t, ctx, fmt.Sprintf("%d ranges beside a nested txn of %d", c.outer, c.inner), o...)
	}
	var cmps []*pb.Compare
	for range 100 {
		cmps = append(cmps, cmpExists("a")[0])
	}
	p.txn(t, ctx, "100 compares, nested txn of 29 in else", &pb.TxnRequest{Compare: cmps, Failure: ops(opTxn(nil, ranges(29), nil))})
	p.txn(t, ctx, "100 compares, nested txn of 28 in else", &pb.TxnRequest{Compare: cmps, Failure: ops(opTxn(nil, ranges(28), nil))})
	p.ops(t, ctx, "three levels", opTxn(nil, ops(opTxn(nil, ranges(127), nil)), nil))
	p.ops(t, ctx, "three levels, within", opTxn(nil, ops(opTxn(nil, ranges(126), nil)), nil))
}

// TestDiffTxnRangeRevisionBounds: inside a Txn any revision but 0 must be
// at least the first readable one and at most the current one, so -1 is
// the current revision until the first compaction and refused after it,
// and -2 always; a plain Range takes every revision up to 0 as the current
// one.
func TestDiffTxnRangeRevisionBounds(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	revs := []int64{-2, -1, 0, 1, 3, 4, 5}
	check := func(stage string) {
		t.Helper()
		for _, rev := range revs {
			p.ops(t, ctx, fmt.Sprintf("%s: txn range at %d", stage, rev), opRange("k", "l", rev))
			p.ops(t, ctx, fmt.Sprintf("%s: write txn range at %d", stage, rev), opPut("w", "v"), opRange("k", "l", rev))
			same(t, p, fmt.Sprintf("%s: range at %d", stage, rev), func(i int) (*pb.RangeResponse, error) {
				return p.kv[i].Range(ctx, &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), Revision: rev})
			}, func(r *pb.RangeResponse) string {
				return fmt.Sprintf("revision=%d count=%d kvs=%s", r.Header.Revision, r.Count, showKVs(r.Kvs))
			})
		}
	}
	p.ops(t, ctx, "seed", opPut("k1", "v"))
	p.ops(t, ctx, "seed", opPut("k2", "v"))
	// Revision 3; each write txn in check adds one.
	check("never compacted")
	for _, at := range []int64{0, 4} {
		same(t, p, fmt.Sprint("compact at ", at), func(i int) (*pb.CompactionResponse, error) {
			return p.kv[i].Compact(ctx, &pb.CompactionRequest{Revision: at})
		}, func(r *pb.CompactionResponse) string { return fmt.Sprint(r.Header.Revision) })
		check(fmt.Sprint("compacted at ", at))
	}
}

// TestDiffPutCheckOrder: which error a put with ignore_value and an
// unknown lease on a missing key gives: in a Txn etcd checks the
// key first, in a Put request the lease first.
func TestDiffPutCheckOrder(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	p.ops(t, ctx, "seed", opPut("present", "v"))
	for _, key := range []string{"missing", "present"} {
		for _, req := range []*pb.PutRequest{
			{Key: []byte(key), IgnoreValue: true, Lease: 12345},
			{Key: []byte(key), IgnoreValue: true},
			{Key: []byte(key), IgnoreLease: true},
			{Key: []byte(key), Value: []byte("v"), Lease: 12345},
		} {
			what := fmt.Sprintf("%s ignore_value=%v ignore_lease=%v lease=%d", key, req.IgnoreValue, req.IgnoreLease, req.Lease)
			p.ops(t, ctx, "txn: "+what, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: req}})
			same(t, p, "put: "+what, func(i int) (*pb.PutResponse, error) { return p.kv[i].Put(ctx, req) },
				func(r *pb.PutResponse) string { return fmt.Sprintf("revision=%d", r.Header.Revision) })
		}
	}
	// The first failing op decides, in execution order.
	p.ops(t, ctx, "lease error before key error", opPut("x", "v"),
		&pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("y"), Lease: 999}}},
		&pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("missing"), IgnoreValue: true}}})
	p.ops(t, ctx, "future range before lease error", opRange("x", "", 1000),
		&pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("y"), Lease: 999}}})
}

// TestDiffTxnDoubleChangeReplayed: after a restart, a watch from the
// first revision replays a key changed twice in one transaction as etcd
// does: every change in order with its value, and the prev_kv of the
// version before the revision (the history Engram keeps on disk).
func TestDiffTxnDoubleChangeReplayed(t *testing.T) {
	t.Parallel()
	rp, ctx := newRestartablePair(t)
	p := rp.pair
	p.ops(t, ctx, "seed", opPut("foo", "0"), opPut("foo/bar", "0"), opPut("other/x", "0"))
	p.ops(t, ctx, "put then from-key delete", opPut("foo/bar", "1"), opDel("foo", "\x00"))
	p.ops(t, ctx, "from-key delete then put", opDel("foo", "\x00"), opPut("foo/new", "2"))
	p.ops(t, ctx, "delete, put, delete", opDel("other", "\x00"), opPut("other/x", "3"), opDel("other", "\x00"))
	p.ops(t, ctx, "nested put, later nested delete", opTxn(nil, ops(opPut("n", "4")), nil), opTxn(nil, ops(opDel("n", "")), nil))
	p.ops(t, ctx, "last", opPut("last", "5"))
	rp.restart()
	p.replay(t, ctx, "restarted", 1, "last")
	// HashKV and snapshots over these revisions: etcd_diff_hashkv_test.go.
}

// TestTxnIgnoreValueAfterDeleteRefused pins a deliberate difference:
// etcd 3.6 accepts a put with ignore_value whose key an earlier op of the
// same Txn deleted, checks it against the state before the Txn, and then
// crashes applying it. Engram refuses it with etcd's "key not found" and
// applies nothing.
func TestTxnIgnoreValueAfterDeleteRefused(t *testing.T) {
	t.Parallel()
	kv := pb.NewKVClient(servertest.Start(t, memkv.New(), servertest.Options{}).Client(t).ActiveConnection())
	ctx := context.Background()
	if _, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("foo/a"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	// Only a from-key delete gets past the duplicate-key rule here.
	_, err := kv.Txn(ctx, &pb.TxnRequest{Success: ops(opDel("foo", "\x00"),
		&pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("foo/a"), IgnoreValue: true}}})})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || st.Message() != "etcdserver: key not found" {
		t.Errorf("txn: %v", err)
	}
	r, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("foo/a")})
	if err != nil || r.Count != 1 || r.Header.Revision != 2 {
		t.Errorf("after the refusals: %v %v", r, err)
	}
}
