package server_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/etcdtest"
)

// reclaimCounter counts the Reclaim calls Defragment makes and passes them
// on to the engine (when it has one), or fails them with fail.
type reclaimCounter struct {
	kv.Store
	calls atomic.Int64
	fail  error
}

func (r *reclaimCounter) Reclaim(ctx context.Context) error {
	r.calls.Add(1)
	if r.fail != nil {
		return r.fail
	}
	if rc, ok := r.Store.(kv.Reclaimer); ok {
		return rc.Reclaim(ctx)
	}
	return nil
}

// allocated is the disk space the badger store takes, as it reports it
// (Status's DbSize): its files' allocated blocks.
func allocated(t *testing.T, s *badger.Store) int64 {
	t.Helper()
	n, err := s.Size()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fillAndDelete writes n keys of 1 KiB in transactions, deletes them all
// and compacts the whole history away, as a cluster's churn leaves a store
// before an operator's `etcdctl defrag`.
func fillAndDelete(ctx context.Context, t *testing.T, c pb.KVClient, n int) {
	t.Helper()
	val := []byte(strings.Repeat("v", 1024))
	for i := 0; i < n; i += 100 {
		var ops []*pb.RequestOp
		for j := i; j < min(i+100, n); j++ {
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: fmt.Appendf(nil, "defrag/%06d", j), Value: val}}})
		}
		if _, err := c.Txn(ctx, &pb.TxnRequest{Success: ops}); err != nil {
			t.Fatal(err)
		}
	}
	del, err := c.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("defrag/"), RangeEnd: []byte("defrag0")})
	if err != nil {
		t.Fatal(err)
	}
	if del.Deleted != int64(n) {
		t.Fatalf("deleted %d keys, want %d", del.Deleted, n)
	}
	if _, err := c.Compact(ctx, &pb.CompactionRequest{Revision: del.Header.Revision, Physical: true}); err != nil {
		t.Fatal(err)
	}
}

// defragLine is etcdctl's defrag output with what differs by nature (the
// endpoint, the time taken) replaced.
var defragEndpoint, defragTook = regexp.MustCompile(`member\[[^\]]*\]`), regexp.MustCompile(`took \S+`)

func defragLine(out string) string {
	return defragTook.ReplaceAllString(defragEndpoint.ReplaceAllString(strings.TrimSpace(out), "member[EP]"), "took D")
}

// TestDiffDefragment: after many keys were written, deleted and compacted
// away, Defragment succeeds on Engram over badger as on etcd 3.6, by raw
// gRPC (the same empty response: etcd sets no header) and through
// etcdctl 3.6's `defrag` (the same "Finished defragmenting" line), and each
// call runs the engine's reclamation once. The badger directory's size
// before and after is logged, not asserted: what badger gives back, and
// when, is its business.
func TestDiffDefragment(t *testing.T) {
	t.Parallel()
	ec, etcdEndpoint := startEtcd(t)
	dir := t.TempDir()
	// No background reclamation: the one measured is Defragment's.
	bs, err := badger.Open(badger.Options{Dir: dir, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	store := &reclaimCounter{Store: bs}
	srv := servertest.Start(t, store, servertest.Options{})
	gc := srv.Client(t)
	// A hang guard, not a measurement.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	p := &pair{names: [2]string{"etcd", "engram"}}
	var maint [2]pb.MaintenanceClient
	for i, c := range []*clientv3.Client{ec, gc} {
		p.kv[i] = pb.NewKVClient(c.ActiveConnection())
		maint[i] = pb.NewMaintenanceClient(c.ActiveConnection())
	}
	for i := range 2 {
		fillAndDelete(ctx, t, p.kv[i], 5000)
	}

	before := allocated(t, bs)
	same(t, p, "defragment", func(i int) (*pb.DefragmentResponse, error) {
		return maint[i].Defragment(ctx, &pb.DefragmentRequest{})
	}, func(r *pb.DefragmentResponse) string { return fmt.Sprintf("ok, header %v", r.Header) })
	afterRPC := allocated(t, bs)
	if n := store.calls.Load(); n != 1 {
		t.Errorf("Defragment reclaimed %d times, want once", n)
	}

	var lines [2]string
	for i, ep := range []string{etcdEndpoint, srv.Endpoint} {
		out, err := etcdtest.Etcdctl(t, "--endpoints="+ep, "defrag")
		if err != nil {
			t.Fatalf("%s: etcdctl defrag: %v", p.names[i], err)
		}
		lines[i] = defragLine(out)
	}
	if lines[0] != lines[1] || !strings.HasPrefix(lines[0], "Finished defragmenting etcd member[EP]") {
		t.Errorf("etcdctl defrag:\n  etcd:   %q\n  engram: %q", lines[0], lines[1])
	}
	t.Logf("etcdctl defrag, normalised, on both: %q", lines[1])
	if n := store.calls.Load(); n != 2 {
		t.Errorf("after etcdctl defrag, %d reclamations, want 2", n)
	}
	t.Logf("badger directory: %d bytes before Defragment, %d after the gRPC call, %d after etcdctl defrag", before, afterRPC, allocated(t, bs))

	// The live data is untouched.
	for i := range 2 {
		if _, err := p.kv[i].Put(ctx, &pb.PutRequest{Key: []byte("after"), Value: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	same(t, p, "range after defragment", func(i int) (*pb.RangeResponse, error) {
		return p.kv[i].Range(ctx, &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("\x00")})
	}, func(r *pb.RangeResponse) string { return fmt.Sprintf("count=%d kvs=%v", r.Count, r.Kvs) })
}

// TestDefragmentEngineFailure: an engine failure answers as etcd answers a
// failed defrag, code Unknown with the error's text; a closed engine
// answers etcd's "server stopped".
func TestDefragmentEngineFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fail error
		code codes.Code
		msg  string
	}{
		{errors.New("badger: reclaim: flatten: disk on fire"), codes.Unknown, "badger: reclaim: flatten: disk on fire"},
		{fmt.Errorf("reclaim: %w", kv.ErrClosed), codes.Unavailable, "etcdserver: server stopped"},
	} {
		store := &reclaimCounter{Store: memkv.New(), fail: tc.fail}
		c := servertest.Start(t, store, servertest.Options{}).Client(t)
		_, err := pb.NewMaintenanceClient(c.ActiveConnection()).Defragment(context.Background(), &pb.DefragmentRequest{})
		if st, _ := status.FromError(err); st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("engine fails with %v: Defragment answered %v, want %s %q", tc.fail, err, tc.code, tc.msg)
		}
	}
}

// TestClusterDefragmentOnFollower: a follower forwards Defragment to the
// leader, which reclaims the shared store once; the follower's own store
// handle is not asked to, since followers never write to the store.
func TestClusterDefragmentOnFollower(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	var stores []*reclaimCounter
	for i := range 2 {
		st := &reclaimCounter{Store: c.shared}
		stores = append(stores, st)
		c.add(fmt.Sprintf("node%d", i), st, servertest.Options{})
	}
	l := c.leader(-1)
	f := 1 - l
	c.following(f, l)
	cl := c.client(f)
	if _, err := cl.Defragment(context.Background(), c.nodes[f].Endpoint); err != nil {
		t.Fatalf("Defragment on the follower: %v", err)
	}
	if lc, fc := stores[l].calls.Load(), stores[f].calls.Load(); lc != 1 || fc != 0 {
		t.Errorf("reclamations: leader %d, follower %d; want 1 and 0", lc, fc)
	}
}
