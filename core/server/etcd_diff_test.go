package server_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/etcdtest"
)

// The differential tests send the same raw requests to a real etcd 3.6 and
// to Engram and compare the answers: etcd is the oracle, not a reading of
// its code. Each case is a difference a differential run once found.

// pair is one etcd and one Engram, each fresh, each with raw gRPC clients
// so that requests clientv3 would refuse to build reach the servers.
type pair struct {
	names [2]string
	kv    [2]pb.KVClient
	lease [2]pb.LeaseClient
	watch [2]pb.WatchClient
	// conn reaches the other services (maintenance, cluster, auth).
	conn [2]grpc.ClientConnInterface
}

func newPair(t *testing.T) (*pair, context.Context) {
	t.Helper()
	ec, _ := startEtcd(t)
	gc := servertest.Start(t, memkv.New(), servertest.Options{}).Client(t)
	// A hang guard, not a measurement.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	p := &pair{names: [2]string{"etcd", "engram"}}
	for i, c := range []*clientv3.Client{ec, gc} {
		p.kv[i] = pb.NewKVClient(c.ActiveConnection())
		p.lease[i] = pb.NewLeaseClient(c.ActiveConnection())
		p.watch[i] = pb.NewWatchClient(c.ActiveConnection())
		p.conn[i] = c.ActiveConnection()
	}
	return p, ctx
}

// startEtcd starts a one-member etcd 3.6 (or skips t as etcdtest.Require
// does) and returns a client of it and its endpoint.
func startEtcd(t *testing.T) (*clientv3.Client, string) {
	t.Helper()
	etcdtest.Require(t)
	e := etcdtest.Start(t, etcdtest.Options{})
	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ec.Close() })
	return ec, e.Endpoint
}

// same calls call on both servers and fails t unless both answered alike:
// the same gRPC status code and message, or responses equal under show.
func same[R any](t *testing.T, p *pair, what string, call func(i int) (R, error), show func(R) string) {
	t.Helper()
	var got [2]string
	for i := range 2 {
		r, err := call(i)
		if err != nil {
			st, _ := status.FromError(err)
			got[i] = fmt.Sprintf("error %s: %s", st.Code(), st.Message())
			continue
		}
		got[i] = show(r)
	}
	if got[0] != got[1] {
		t.Errorf("%s:\n  etcd:   %s\n  engram: %s", what, got[0], got[1])
	}
}

func showTxn(r *pb.TxnResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "succeeded=%v revision=%d", r.Succeeded, r.Header.Revision)
	for _, op := range r.Responses {
		fmt.Fprintf(&b, " %T", op.Response)
	}
	return b.String()
}

// TestDiffCompareUnknownTargetAndResult: etcd evaluates a compare whose
// target or result it does not know instead of refusing it: an
// unknown result holds; an unknown target compares nothing, so its result
// decides alone. Both on a missing and on a present key.
func TestDiffCompareUnknownTargetAndResult(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	same(t, p, "put", func(i int) (*pb.PutResponse, error) {
		return p.kv[i].Put(ctx, &pb.PutRequest{Key: []byte("present"), Value: []byte("v")})
	}, func(r *pb.PutResponse) string { return fmt.Sprint(r.Header.Revision) })
	for _, key := range []string{"present", "missing"} {
		for _, c := range []struct{ target, result int32 }{{1, 7}, {9, 0}, {9, 1}, {9, 2}, {9, 3}, {0, 7}, {3, 7}} {
			cmp := &pb.Compare{Key: []byte(key), Target: pb.Compare_CompareTarget(c.target), Result: pb.Compare_CompareResult(c.result)}
			same(t, p, fmt.Sprintf("txn on %s: compare target %d result %d", key, c.target, c.result), func(i int) (*pb.TxnResponse, error) {
				return p.kv[i].Txn(ctx, &pb.TxnRequest{
					Compare: []*pb.Compare{cmp},
					Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("present")}}}},
				})
			}, showTxn)
		}
	}
}

// TestDiffEmptyRequestOp: etcd refuses a transaction holding an empty op
// with InvalidArgument "etcdserver: key not found", in either
// branch and in a nested transaction.
func TestDiffEmptyRequestOp(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	for name, txn := range map[string]*pb.TxnRequest{
		"success": {Success: []*pb.RequestOp{{}}},
		"failure": {Failure: []*pb.RequestOp{{}}},
		"nested": {Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
			Success: []*pb.RequestOp{{}},
		}}}}},
	} {
		same(t, p, "empty op in "+name, func(i int) (*pb.TxnResponse, error) { return p.kv[i].Txn(ctx, txn) }, showTxn)
	}
}

// TestDiffNegativeLeaseID: etcd grants a lease with a negative ID the
// client chose, and the lease then works like any other: keys
// attach to it, TimeToLive lists them, Leases lists it, a second grant of
// the ID is refused and revoking it deletes its keys.
func TestDiffNegativeLeaseID(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	const id = -42
	same(t, p, "grant", func(i int) (*pb.LeaseGrantResponse, error) {
		return p.lease[i].LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: id, TTL: 600})
	}, func(r *pb.LeaseGrantResponse) string {
		return fmt.Sprintf("id=%d ttl=%d error=%q", r.ID, r.TTL, r.Error)
	})
	same(t, p, "grant again", func(i int) (*pb.LeaseGrantResponse, error) {
		return p.lease[i].LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: id, TTL: 600})
	}, func(r *pb.LeaseGrantResponse) string { return fmt.Sprintf("id=%d", r.ID) })
	same(t, p, "put with the lease", func(i int) (*pb.PutResponse, error) {
		return p.kv[i].Put(ctx, &pb.PutRequest{Key: []byte("leased"), Value: []byte("v"), Lease: id})
	}, func(r *pb.PutResponse) string { return fmt.Sprint(r.Header.Revision) })
	same(t, p, "time to live", func(i int) (*pb.LeaseTimeToLiveResponse, error) {
		return p.lease[i].LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: id, Keys: true})
	}, func(r *pb.LeaseTimeToLiveResponse) string {
		return fmt.Sprintf("id=%d granted=%d keys=%q", r.ID, r.GrantedTTL, r.Keys)
	})
	same(t, p, "leases", func(i int) (*pb.LeaseLeasesResponse, error) {
		return p.lease[i].LeaseLeases(ctx, &pb.LeaseLeasesRequest{})
	}, func(r *pb.LeaseLeasesResponse) string { return fmt.Sprint(r.Leases) })
	same(t, p, "range leased key", func(i int) (*pb.RangeResponse, error) {
		return p.kv[i].Range(ctx, &pb.RangeRequest{Key: []byte("leased")})
	}, func(r *pb.RangeResponse) string { return fmt.Sprint(r.Kvs) })
	same(t, p, "revoke", func(i int) (*pb.LeaseRevokeResponse, error) {
		return p.lease[i].LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: id})
	}, func(r *pb.LeaseRevokeResponse) string { return fmt.Sprint(r.Header.Revision) })
	same(t, p, "range after revoke", func(i int) (*pb.RangeResponse, error) {
		return p.kv[i].Range(ctx, &pb.RangeRequest{Key: []byte("leased")})
	}, func(r *pb.RangeResponse) string {
		return fmt.Sprintf("count=%d revision=%d", r.Count, r.Header.Revision)
	})
}

// watchPair is one raw Watch stream on each server of a pair.
type watchPair [2]pb.Watch_WatchClient

func (p *pair) watchStreams(t *testing.T, ctx context.Context) watchPair {
	t.Helper()
	var w watchPair
	for i := range 2 {
		s, err := p.watch[i].Watch(ctx)
		if err != nil {
			t.Fatalf("%s: watch stream: %v", p.names[i], err)
		}
		w[i] = s
	}
	return w
}

func showWatch(r *pb.WatchResponse) string {
	rev := int64(-1)
	if r.Header != nil {
		rev = r.Header.Revision
	}
	return fmt.Sprintf("revision=%d watch_id=%d created=%v canceled=%v compact_revision=%d reason=%q events=%d",
		rev, r.WatchId, r.Created, r.Canceled, r.CompactRevision, r.CancelReason, len(r.Events))
}

// exchange sends req on both streams and compares the next response of
// each.
func (w watchPair) exchange(t *testing.T, p *pair, what string, req *pb.WatchRequest) {
	t.Helper()
	same(t, p, what, func(i int) (*pb.WatchResponse, error) {
		if err := w[i].Send(req); err != nil {
			return nil, err
		}
		return w[i].Recv()
	}, showWatch)
}

func createWatch(c *pb.WatchCreateRequest) *pb.WatchRequest {
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}}
}

// TestDiffWatchCreateRefusals: etcd refuses a watch on an empty range
// (range_end at or below the key), a negative start revision and a
// duplicate client-chosen ID with watch ID -1,
// created and canceled, and such a refusal takes no ID from the stream, so
// the IDs of later watches agree too.
func TestDiffWatchCreateRefusals(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	w := p.watchStreams(t, ctx)
	for _, c := range []struct {
		what string
		req  *pb.WatchCreateRequest
	}{
		{"range end below the key", &pb.WatchCreateRequest{Key: []byte("b"), RangeEnd: []byte("a")}},
		{"range end equal to the key", &pb.WatchCreateRequest{Key: []byte("b"), RangeEnd: []byte("b")}},
		{"negative start revision", &pb.WatchCreateRequest{Key: []byte("a"), StartRevision: -5}},
		{"negative start on an empty range (the start is judged first)", &pb.WatchCreateRequest{Key: []byte("foo"), RangeEnd: []byte("foo"), StartRevision: -1}},
		{"negative start on an over-long key", &pb.WatchCreateRequest{Key: bytes.Repeat([]byte("k"), 40000), StartRevision: -1}},
		{"auto ID after refusals", &pb.WatchCreateRequest{Key: []byte("a")}},
		{"explicit ID", &pb.WatchCreateRequest{Key: []byte("a"), WatchId: 77}},
		{"duplicate explicit ID", &pb.WatchCreateRequest{Key: []byte("b"), WatchId: 77}},
		{"auto ID after a duplicate", &pb.WatchCreateRequest{Key: []byte("c")}},
		{"from key (range end 0x00)", &pb.WatchCreateRequest{Key: []byte("b"), RangeEnd: []byte{0}}},
	} {
		w.exchange(t, p, c.what, createWatch(c.req))
	}
}

// TestDiffWatchBelowCompaction: a watch from below the compacted revision
// is created, then canceled with the compacted revision (etcd's
// cancel carries header revision 0).
func TestDiffWatchBelowCompaction(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	for n := range 4 {
		same(t, p, "put", func(i int) (*pb.PutResponse, error) {
			return p.kv[i].Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprint("k", n)), Value: []byte("v")})
		}, func(r *pb.PutResponse) string { return fmt.Sprint(r.Header.Revision) })
	}
	same(t, p, "compact", func(i int) (*pb.CompactionResponse, error) {
		return p.kv[i].Compact(ctx, &pb.CompactionRequest{Revision: 4, Physical: true})
	}, func(r *pb.CompactionResponse) string { return fmt.Sprint(r.Header.Revision) })
	w := p.watchStreams(t, ctx)
	w.exchange(t, p, "create from revision 2", createWatch(&pb.WatchCreateRequest{Key: []byte("k"), RangeEnd: []byte("l"), StartRevision: 2}))
	same(t, p, "the cancel", func(i int) (*pb.WatchResponse, error) { return w[i].Recv() }, showWatch)
}

// TestDiffLeaseGrantTTLs: the TTL a grant receives (etcd raises short and
// non-positive TTLs to its minimum) and its refusal above the maximum; each
// granted lease is revoked at once, so none expires during the test.
func TestDiffLeaseGrantTTLs(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	for n, ttl := range []int64{-5, 0, 1, 2, 3, 9000000000, 9000000001} {
		id := int64(100 + n)
		same(t, p, fmt.Sprint("grant TTL ", ttl), func(i int) (*pb.LeaseGrantResponse, error) {
			return p.lease[i].LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: id, TTL: ttl})
		}, func(r *pb.LeaseGrantResponse) string {
			return fmt.Sprintf("id=%d ttl=%d error=%q", r.ID, r.TTL, r.Error)
		})
		same(t, p, fmt.Sprint("revoke after TTL ", ttl), func(i int) (*pb.LeaseRevokeResponse, error) {
			return p.lease[i].LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: id})
		}, func(r *pb.LeaseRevokeResponse) string { return fmt.Sprint(r.Header.Revision) })
	}
}
