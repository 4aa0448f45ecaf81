package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/internal/etcdtest"
)

// The differential tests send the same raw requests to a real etcd 3.6 and
// to Engram and compare the answers: etcd is the oracle, not a reading of
// its code. Each case is a difference a differential run once found (issue
// 14's list; the number is its item).

// pair is one etcd and one Engram, each fresh, each with raw gRPC clients
// so that requests clientv3 would refuse to build reach the servers.
type pair struct {
	names [2]string
	kv    [2]pb.KVClient
	lease [2]pb.LeaseClient
}

func newPair(t *testing.T) (*pair, context.Context) {
	t.Helper()
	etcdtest.Require(t)
	e := etcdtest.Start(t, etcdtest.Options{})
	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ec.Close() })
	gc := servertest.Start(t, servertest.Options{}).Client(t)
	// A hang guard, not a measurement.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	p := &pair{names: [2]string{"etcd", "engram"}}
	for i, c := range []*clientv3.Client{ec, gc} {
		p.kv[i] = pb.NewKVClient(c.ActiveConnection())
		p.lease[i] = pb.NewLeaseClient(c.ActiveConnection())
	}
	return p, ctx
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
// target or result it does not know instead of refusing it (item 5): an
// unknown result holds; an unknown target compares nothing, so its result
// decides alone. Both on a missing and on a present key.
func TestDiffCompareUnknownTargetAndResult(t *testing.T) {
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
// with InvalidArgument "etcdserver: key not found" (item 6), in either
// branch and in a nested transaction.
func TestDiffEmptyRequestOp(t *testing.T) {
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
// client chose (item 13), and the lease then works like any other: keys
// attach to it, TimeToLive lists them, Leases lists it, a second grant of
// the ID is refused and revoking it deletes its keys.
func TestDiffNegativeLeaseID(t *testing.T) {
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
