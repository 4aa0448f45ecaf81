package server_test

import (
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/internal/etcdtest"
)

var mvccCounters = []string{"etcd_mvcc_range_total", "etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total"}

// mvccDay sends a fixed sequence of KV requests covering each shape that
// moves etcd's MVCC counters differently.
func mvccDay(t *testing.T, endpoint string) {
	t.Helper()
	ctx, conn := rawConn(t, endpoint)
	kv, lc := pb.NewKVClient(conn), pb.NewLeaseClient(conn)
	k := func(s string) []byte { return []byte("/mvcc/" + s) }
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	put := func(p *pb.PutRequest) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: p}}
	}
	rng := func(key string) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: k(key)}}}
	}
	del := func(d *pb.DeleteRangeRequest) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: d}}
	}
	txn := func(r *pb.TxnRequest) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: r}}
	}
	exists := func(key string) *pb.Compare {
		return &pb.Compare{Key: k(key), Target: pb.Compare_VERSION, Result: pb.Compare_GREATER, TargetUnion: &pb.Compare_Version{Version: 0}}
	}

	must(kv.Put(ctx, &pb.PutRequest{Key: k("a"), Value: []byte("1")}))
	must(kv.Put(ctx, &pb.PutRequest{Key: k("a"), Value: []byte("2"), PrevKv: true}))
	must(kv.Put(ctx, &pb.PutRequest{Key: k("b"), Value: []byte("1")}))
	must(kv.Put(ctx, &pb.PutRequest{Key: k("a"), IgnoreValue: true}))
	must(kv.Range(ctx, &pb.RangeRequest{Key: k("a")}))
	must(kv.Range(ctx, &pb.RangeRequest{Key: k(""), RangeEnd: k("\xff"), Serializable: true, CountOnly: true}))
	must(kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: k("b")}))
	must(kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: k("nothing"), PrevKv: true}))
	// Read-only, write, failing and nested Txns, compares included.
	must(kv.Txn(ctx, &pb.TxnRequest{}))
	must(kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{rng("a")}}))
	must(kv.Txn(ctx, &pb.TxnRequest{Compare: []*pb.Compare{exists("a"), exists("a")}, Success: []*pb.RequestOp{rng("a"), rng("b")}}))
	must(kv.Txn(ctx, &pb.TxnRequest{Compare: []*pb.Compare{exists("a")},
		Success: []*pb.RequestOp{put(&pb.PutRequest{Key: k("c"), Value: []byte("1"), PrevKv: true}), del(&pb.DeleteRangeRequest{Key: k("x"), PrevKv: true})}}))
	must(kv.Txn(ctx, &pb.TxnRequest{Compare: []*pb.Compare{exists("missing")},
		Success: []*pb.RequestOp{rng("a")}, Failure: []*pb.RequestOp{put(&pb.PutRequest{Key: k("d"), Value: []byte("1")})}}))
	must(kv.Txn(ctx, &pb.TxnRequest{Compare: []*pb.Compare{exists("missing")}, Success: []*pb.RequestOp{rng("a")}}))
	must(kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{txn(&pb.TxnRequest{Success: []*pb.RequestOp{rng("a")}})}}))
	must(kv.Txn(ctx, &pb.TxnRequest{Compare: []*pb.Compare{exists("a")}, Success: []*pb.RequestOp{
		rng("a"),
		txn(&pb.TxnRequest{Compare: []*pb.Compare{exists("missing")},
			Success: []*pb.RequestOp{rng("a")},
			Failure: []*pb.RequestOp{put(&pb.PutRequest{Key: k("a"), IgnoreValue: true}), put(&pb.PutRequest{Key: k("c"), IgnoreLease: true})}}),
	}}))
	// kube-apiserver's create and its optimistic update.
	must(kv.Txn(ctx, &pb.TxnRequest{
		Compare: []*pb.Compare{{Key: k("pod"), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: 0}}},
		Success: []*pb.RequestOp{put(&pb.PutRequest{Key: k("pod"), Value: []byte("v1")})}}))
	must(kv.Txn(ctx, &pb.TxnRequest{
		Compare: []*pb.Compare{{Key: k("pod"), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: 1}}},
		Success: []*pb.RequestOp{put(&pb.PutRequest{Key: k("pod"), Value: []byte("v2")})}, Failure: []*pb.RequestOp{rng("pod")}}))
	r, err := kv.Range(ctx, &pb.RangeRequest{Key: k("a")})
	if err != nil {
		t.Fatal(err)
	}
	must(kv.Compact(ctx, &pb.CompactionRequest{Revision: r.Header.Revision, Physical: true}))
	// Revoking a lease deletes its keys in one MVCC transaction; with
	// none attached it deletes nothing.
	for _, keys := range []string{"", "l1", "l1 l2 l3"} {
		l, err := lc.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range strings.Fields(keys) {
			must(kv.Put(ctx, &pb.PutRequest{Key: k(key), Value: []byte("1"), Lease: l.ID}))
		}
		must(lc.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: l.ID}))
	}
}

// TestEtcdMVCCMetricsMatchEtcd runs the same KV requests on etcd 3.6 and
// Engram and compares how far etcd's MVCC counters moved on each.
func TestEtcdMVCCMetricsMatchEtcd(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t, etcdtest.Options{})
	endpoint, url := metricsEngram(t)
	eurl := e.ClientURL + "/metrics"
	values := func(url string) map[string]float64 {
		v := map[string]float64{}
		for name, f := range scrape(t, url) {
			if len(f.GetMetric()) == 1 {
				v[name] = f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return v
	}
	eBefore, before := values(eurl), values(url)
	mvccDay(t, e.Endpoint)
	mvccDay(t, endpoint)
	eAfter, after := values(eurl), values(url)
	fams := scrape(t, url)
	efams := scrape(t, eurl)
	for _, name := range mvccCounters {
		f, ef := fams[name], efams[name]
		if f == nil || ef == nil {
			t.Errorf("%s: etcd has it %v, Engram %v", name, ef != nil, f != nil)
			continue
		}
		if f.GetType() != ef.GetType() || f.GetHelp() != ef.GetHelp() {
			t.Errorf("%s: %v %q, etcd %v %q", name, f.GetType(), f.GetHelp(), ef.GetType(), ef.GetHelp())
		}
		got, want := after[name]-before[name], eAfter[name]-eBefore[name]
		t.Logf("%s: moved %v (etcd %v)", name, got, want)
		if got != want {
			t.Errorf("%s moved %v, etcd's %v", name, got, want)
		}
	}
}
