package mvcc

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/memkv"
)

// countingStore counts the engine's point reads.
type countingStore struct {
	kv.Store
	gets atomic.Int64
}

func (c *countingStore) Get(ctx context.Context, key []byte) ([]byte, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, key)
}

// reopen closes b and opens a backend on the same store with an empty
// latest-record cache: the store holds keys the new writer has never seen.
func reopen(t *testing.T, b *Backend, s kv.Store, reg prometheus.Registerer) *Backend {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	nb, err := Open(context.Background(), Options{Store: s, Logger: quiet, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nb.Close() })
	return nb
}

// TestPresumedCreateReadsNothing: a create of a key the writer does not
// know reads nothing from the engine, and lands.
func TestPresumedCreateReadsNothing(t *testing.T) {
	s := &countingStore{Store: memkv.New()}
	b, err := Open(context.Background(), Options{Store: s, Logger: quiet, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	before := s.gets.Load()
	r, err := b.Txn(context.Background(), createTxn("fresh"))
	if err != nil || !r.Succeeded {
		t.Fatalf("create: %v %v", r, err)
	}
	if n := s.gets.Load() - before; n != 0 {
		t.Fatalf("the create read the engine %d times", n)
	}
	if got := counterValue(t, b.metrics.prefetch[prefetchPresumed]); got != 1 {
		t.Fatalf("presumed lookups: %v, want 1", got)
	}
	kv, err := get(t, b, "fresh", 0)
	if err != nil || kv == nil || kv.Version != 1 || kv.CreateRevision != r.Header.Revision {
		t.Fatalf("created key: %+v %v", kv, err)
	}
}

// TestPresumedAbsentExists: the key exists in the store but not in the
// cache (written before this writer started, or alive as a tombstone). The
// presumption fails at commit, nothing of that attempt is visible, and the
// create is answered as if it had read the key: no error, no revision
// taken by the failed attempt, and the next creates read their keys for a
// while.
func TestPresumedAbsentExists(t *testing.T) {
	for _, tc := range []struct {
		name      string
		deleted   bool // the key is a tombstone: the create succeeds
		succeeded bool
	}{
		{name: "live", succeeded: false},
		{name: "tombstone", deleted: true, succeeded: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := memkv.New()
			b := open(t, s)
			created := put(t, b, "k", "old")
			if tc.deleted {
				del(t, b, "k")
			}
			reg := prometheus.NewRegistry()
			b = reopen(t, b, s, reg)
			rev := b.Rev()
			events := &eventLog{}
			b.SetNotifier(events)

			r, err := b.Txn(context.Background(), createTxn("k"))
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if r.Succeeded != tc.succeeded {
				t.Fatalf("create succeeded=%v, want %v", r.Succeeded, tc.succeeded)
			}
			if got := counterValue(t, b.metrics.presumeFailed); got != 1 {
				t.Fatalf("failed presumptions: %v, want 1", got)
			}
			kv, err := get(t, b, "k", 0)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.succeeded {
				// The key is untouched and the failed attempt took no
				// revision.
				if r.Header.Revision != rev || b.Rev() != rev || kv.CreateRevision != created || string(kv.Value) != "old" {
					t.Fatalf("after the refused create: header %d, rev %d (was %d), key %+v", r.Header.Revision, b.Rev(), rev, kv)
				}
				if len(events.events) != 0 {
					t.Fatalf("events of a create that did not apply: %v", events.events)
				}
			} else {
				// Created again over its tombstone, at the next revision.
				if r.Header.Revision != rev+1 || kv.Version != 1 || kv.CreateRevision != rev+1 || string(kv.Value) != "v" {
					t.Fatalf("after the create: header %d (want %d), key %+v", r.Header.Revision, rev+1, kv)
				}
				if len(events.events) != 1 || events.events[0].Type != mvccpb.PUT || events.events[0].PrevKv != nil {
					t.Fatalf("events: %v", events.events)
				}
			}
			// The holdoff: the next create reads its key.
			presumed := counterValue(t, b.metrics.prefetch[prefetchPresumed])
			if r, err := b.Txn(context.Background(), createTxn("fresh")); err != nil || !r.Succeeded {
				t.Fatalf("create after the failure: %v %v", r, err)
			}
			if got := counterValue(t, b.metrics.prefetch[prefetchPresumed]); got != presumed {
				t.Fatalf("a create presumed its key during the holdoff")
			}
		})
	}
}

// TestPresumedAbsentBehindPipeline: a group whose presumption fails has a
// group behind it built on its state (a put of the same key). Both are
// evaluated again on what the store holds: the create fails, the put
// replaces the old version, revisions stay dense and watchers see the put
// alone.
func TestPresumedAbsentBehindPipeline(t *testing.T) {
	s := memkv.New()
	b := open(t, s)
	created := put(t, b, "k", "old")
	reg := prometheus.NewRegistry()
	gate := newHoldingStore(s)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := Open(context.Background(), Options{Store: gate, Logger: quiet, Registerer: reg, MaxGroupRequests: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	rev := b.Rev()
	events := &eventLog{}
	b.SetNotifier(events)

	gate.close()
	create := make(chan result, 1)
	go func() {
		r, err := b.Txn(context.Background(), createTxn("k"))
		create <- result{txn: r, err: err}
	}()
	gate.awaitWaiting(1)
	putDone := make(chan result, 1)
	go func() {
		r, err := b.Put(context.Background(), &pb.PutRequest{Key: []byte("k"), Value: []byte("new"), PrevKv: true})
		res := result{err: err}
		if err == nil {
			res.rev, res.txn = r.Header.Revision, &pb.TxnResponse{Responses: []*pb.ResponseOp{{Response: &pb.ResponseOp_ResponsePut{ResponsePut: r}}}}
		}
		putDone <- res
	}()
	// The put is evaluated into the next group (a group holds one
	// request here), on the create's pending state, while the create's
	// commit is held.
	awaitInFlight(b, 2)
	gate.open()

	c := <-create
	if c.err != nil || c.txn.Succeeded {
		t.Fatalf("create of an existing key: %+v %v", c.txn, c.err)
	}
	p := <-putDone
	if p.err != nil {
		t.Fatal(p.err)
	}
	if p.rev != rev+1 {
		t.Fatalf("put at %d, want %d", p.rev, rev+1)
	}
	prev := p.txn.Responses[0].GetResponsePut().PrevKv
	if prev == nil || string(prev.Value) != "old" || prev.CreateRevision != created {
		t.Fatalf("put's previous version: %+v", prev)
	}
	kv, err := get(t, b, "k", 0)
	if err != nil || string(kv.Value) != "new" || kv.Version != 2 || kv.CreateRevision != created {
		t.Fatalf("key after the put: %+v %v", kv, err)
	}
	if len(events.events) != 1 || events.events[0].Kv.ModRevision != rev+1 || string(events.events[0].PrevKv.GetValue()) != "old" {
		t.Fatalf("events: %v", events.events)
	}
	if got := counterValue(t, b.metrics.presumeFailed); got != 1 {
		t.Fatalf("failed presumptions: %v, want 1", got)
	}
}

// TestPresumable: only a create's key is presumed absent.
func TestPresumable(t *testing.T) {
	mod0 := &pb.Compare{Key: []byte("k"), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{}}
	put := putOp("k", "v")
	cases := []struct {
		name string
		txn  *pb.TxnRequest
		want bool
	}{
		{"create", &pb.TxnRequest{Compare: []*pb.Compare{mod0}, Success: []*pb.RequestOp{put}}, true},
		{"create with a failure branch", &pb.TxnRequest{Compare: []*pb.Compare{mod0}, Success: []*pb.RequestOp{put},
			Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}}}}, true},
		{"version 0", &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("k"), Target: pb.Compare_VERSION, TargetUnion: &pb.Compare_Version{}}},
			Success: []*pb.RequestOp{put}}, true},
		{"create revision 0", &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("k"), Target: pb.Compare_CREATE, TargetUnion: &pb.Compare_CreateRevision{}}},
			Success: []*pb.RequestOp{put}}, true},
		{"an update", &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("k"), Target: pb.Compare_MOD, TargetUnion: &pb.Compare_ModRevision{ModRevision: 5}}},
			Success: []*pb.RequestOp{put}}, false},
		{"not equal", &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("k"), Target: pb.Compare_MOD, Result: pb.Compare_NOT_EQUAL, TargetUnion: &pb.Compare_ModRevision{}}},
			Success: []*pb.RequestOp{put}}, false},
		{"a range compare", &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("k"), RangeEnd: []byte("l"), Target: pb.Compare_MOD, TargetUnion: &pb.Compare_ModRevision{}}},
			Success: []*pb.RequestOp{put}}, false},
		{"target and union disagree", &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("k"), Target: pb.Compare_VALUE, TargetUnion: &pb.Compare_ModRevision{}}},
			Success: []*pb.RequestOp{put}}, false},
		{"another key", &pb.TxnRequest{Compare: []*pb.Compare{mod0}, Success: []*pb.RequestOp{putOp("other", "v")}}, false},
		{"two ops", &pb.TxnRequest{Compare: []*pb.Compare{mod0}, Success: []*pb.RequestOp{put, putOp("other", "v")}}, false},
		{"keeps the value", &pb.TxnRequest{Compare: []*pb.Compare{mod0}, Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{
			RequestPut: &pb.PutRequest{Key: []byte("k"), IgnoreValue: true}}}}}, false},
		{"keeps the lease", &pb.TxnRequest{Compare: []*pb.Compare{mod0}, Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{
			RequestPut: &pb.PutRequest{Key: []byte("k"), Value: []byte("v"), IgnoreLease: true}}}}}, false},
		{"no compare", &pb.TxnRequest{Success: []*pb.RequestOp{put}}, false},
	}
	for _, tc := range cases {
		if got := presumable(tc.txn) != nil; got != tc.want {
			t.Errorf("%s: presumable %v, want %v", tc.name, got, tc.want)
		}
	}
}
