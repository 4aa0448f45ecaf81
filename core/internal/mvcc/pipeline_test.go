package mvcc

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
	"github.com/engramkv/engram/engines/memkv"
)

// holdingStore holds every Commit while closed, so a test can stack groups
// behind one in flight, and records the highest revision whose change-log
// record a successful Commit wrote.
type holdingStore struct {
	kv.Store
	mu      sync.Mutex
	cond    *sync.Cond
	closed  bool
	waiting int
	// committed is the highest revision durably committed so far.
	committed atomic.Int64
}

func newHoldingStore(s kv.Store) *holdingStore {
	g := &holdingStore{Store: s}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *holdingStore) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

func (g *holdingStore) open() {
	g.mu.Lock()
	g.closed = false
	g.mu.Unlock()
	g.cond.Broadcast()
}

// awaitWaiting returns once n commits are held at the gate.
func (g *holdingStore) awaitWaiting(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.waiting < n {
		g.cond.Wait()
	}
}

func (g *holdingStore) Commit(ctx context.Context, ops []kv.Op) error {
	g.mu.Lock()
	g.waiting++
	g.cond.Broadcast()
	for g.closed {
		g.cond.Wait()
	}
	g.waiting--
	g.mu.Unlock()
	err := g.Store.Commit(ctx, ops)
	// What landed is what the store holds, whatever Commit answered (an
	// uncertain outcome may have been applied).
	for _, op := range ops {
		if rev, derr := coder.DecodeEventKey(op.Key); derr == nil && op.Kind != kv.OpDelete {
			if _, gerr := g.Store.Get(ctx, op.Key); gerr == nil {
				storeMax(&g.committed, rev)
			}
		}
	}
	return err
}

// eventLog records what the backend hands to watchers.
type eventLog struct {
	mu     sync.Mutex
	events []*mvccpb.Event
}

func (l *eventLog) Notify(_ int64, evs []*mvccpb.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, evs...)
}

func createTxn(key string) *pb.TxnRequest {
	return &pb.TxnRequest{
		Compare: []*pb.Compare{{Key: []byte(key), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: 0}}},
		Success: []*pb.RequestOp{putOp(key, "v")},
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// awaitInFlight spins until the pipeline holds n groups: the writer fills it
// without any outside event to wait for.
func awaitInFlight(b *Backend, n int) {
	for b.w.p.inFlight() < n {
		runtime.Gosched()
	}
}

// TestPrefetchStaleAfterWrite: a record read ahead, then changed by a write
// that committed before the request reached the writer, is read again: the
// create's compare sees the key. Creates read their keys here instead of
// presuming them absent (presume_test.go has those).
func TestPrefetchStaleAfterWrite(t *testing.T) {
	reg := prometheus.NewRegistry()
	b, err := Open(context.Background(), Options{Store: memkv.New(), Registerer: reg, ReadCreates: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	r := b.txnRequest(context.Background(), createTxn("k"), false)
	if pf, ok := r.prefetch.lookup([]byte("k")); !ok || pf.found {
		t.Fatalf("read ahead: %+v %v", pf, ok)
	}
	put(t, b, "k", "first")
	res, err := b.submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if res.txn.Succeeded {
		t.Fatal("create succeeded on a key written after its read ahead")
	}
	if got := counterValue(t, b.metrics.prefetch[prefetchStale]); got != 1 {
		t.Fatalf("stale prefetches counted: %v, want 1", got)
	}
	// The ordinary path: a fresh key's read ahead is used.
	before := counterValue(t, b.metrics.prefetch[prefetchUsed])
	if r, err := b.Txn(context.Background(), createTxn("fresh")); err != nil || !r.Succeeded {
		t.Fatalf("create: %v %v", r, err)
	}
	if got := counterValue(t, b.metrics.prefetch[prefetchUsed]); got != before+1 {
		t.Fatalf("used prefetches: %v, want %v", got, before+1)
	}
}

// TestPrefetchStaleBehindPipelinedWrite: the key was written by a group
// still committing (the store does not show it yet); the writer evaluates
// on that group's state. If that group then fails, the request is evaluated
// again on what the store holds.
func TestPrefetchStaleBehindPipelinedWrite(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("first-fails=%v", fail), func(t *testing.T) {
			faults := kvfault.Wrap(memkv.New())
			gate := newHoldingStore(faults)
			b := open(t, gate)
			r := b.txnRequest(context.Background(), createTxn("k"), false)

			gate.close()
			first := make(chan error, 1)
			go func() {
				_, err := b.Put(context.Background(), &pb.PutRequest{Key: []byte("k"), Value: []byte("first")})
				first <- err
			}()
			gate.awaitWaiting(1)
			second := make(chan result, 1)
			go func() {
				res, err := b.submit(context.Background(), r)
				res.err = err
				second <- res
			}()
			// The create is evaluated into the next group, on the Put's
			// pending state, while the Put's commit is held.
			for len(b.reqs) > 0 || b.w.p.idle() {
				runtime.Gosched()
			}
			if fail {
				faults.FailCommits(kvfault.Fault{Err: errors.New("disk full")})
			}
			gate.open()
			err := <-first
			res := <-second
			if res.err != nil {
				t.Fatal(res.err)
			}
			if fail {
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("first write: %v", err)
				}
				if !res.txn.Succeeded || res.txn.Header.Revision != 2 {
					t.Fatalf("create after the failed write: %+v, want success at 2", res.txn)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.txn.Succeeded {
				t.Fatal("create succeeded over a pipelined write of the same key")
			}
		})
	}
}

// TestPipelineFaults injects a commit failure or an uncertain outcome into
// the second of several groups in the pipeline and checks that nothing was
// built on a group that did not land: every acknowledged write is stored at
// its revision and was handed to watchers once, in order; revisions stay
// dense; nothing failed is visible; no write was acknowledged before the
// commit holding it returned.
func TestPipelineFaults(t *testing.T) {
	uncertain := fmt.Errorf("timeout: %w", kv.ErrUncertain)
	cases := []struct {
		name  string
		fault kvfault.Fault
		lost  bool // the second group's writes fail
	}{
		{"failed", kvfault.Fault{Err: errors.New("disk full")}, true},
		{"uncertain-not-applied", kvfault.Fault{Err: uncertain}, true},
		{"uncertain-applied", kvfault.Fault{Err: uncertain, Apply: true}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			faults := kvfault.Wrap(memkv.New())
			gate := newHoldingStore(faults)
			b, err := Open(context.Background(), Options{Store: gate, Logger: quiet, MaxGroupRequests: 2, PipelineDepth: 4})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			events := &eventLog{}
			b.SetNotifier(events)

			const n = 16
			type outcome struct {
				key       string
				rev       int64
				committed int64 // the store's highest committed revision at the ack
				err       error
			}
			out := make(chan outcome, n)
			gate.close()
			for i := range n {
				go func() {
					key := fmt.Sprintf("k%02d", i)
					r, err := b.Txn(context.Background(), createTxn(key))
					o := outcome{key: key, committed: gate.committed.Load(), err: err}
					if err == nil {
						if !r.Succeeded {
							o.err = fmt.Errorf("create of a fresh key failed its compare")
						}
						o.rev = r.Header.Revision
					}
					out <- o
				}()
			}
			// One group held in commit and three full ones queued.
			gate.awaitWaiting(1)
			awaitInFlight(b, 4)
			faults.FailCommits(kvfault.Fault{}, tc.fault)
			gate.open()

			var acked []outcome
			failed := 0
			for range n {
				o := <-out
				switch {
				case o.err == nil:
					if o.rev > o.committed {
						t.Errorf("%s acknowledged at revision %d while the store had committed only %d", o.key, o.rev, o.committed)
					}
					acked = append(acked, o)
				case errors.Is(o.err, ErrUnavailable):
					failed++
				default:
					t.Errorf("%s: %v", o.key, o.err)
				}
			}
			if want := map[bool]int{true: 2, false: 0}[tc.lost]; failed != want {
				t.Errorf("%d writes failed, want %d (the second group's)", failed, want)
			}
			slices.SortFunc(acked, func(a, b outcome) int { return int(a.rev - b.rev) })
			for i, o := range acked {
				if o.rev != int64(i)+2 {
					t.Fatalf("acknowledged revisions not dense: %+v", acked)
				}
			}
			if b.Rev() != int64(len(acked))+1 {
				t.Fatalf("revision %d after %d acknowledged writes", b.Rev(), len(acked))
			}
			for _, o := range acked {
				kv, err := get(t, b, o.key, 0)
				if err != nil || kv == nil || kv.ModRevision != o.rev {
					t.Fatalf("%s: stored %+v (%v), acknowledged at %d", o.key, kv, err, o.rev)
				}
			}
			for i := range n {
				key := fmt.Sprintf("k%02d", i)
				if !slices.ContainsFunc(acked, func(o outcome) bool { return o.key == key }) {
					if kv, _ := get(t, b, key, 0); kv != nil {
						t.Fatalf("failed write %s is visible: %+v", key, kv)
					}
				}
			}
			events.mu.Lock()
			defer events.mu.Unlock()
			if len(events.events) != len(acked) {
				t.Fatalf("%d events for %d acknowledged writes", len(events.events), len(acked))
			}
			for i, ev := range events.events {
				if ev.Kv.ModRevision != acked[i].rev || string(ev.Kv.Key) != acked[i].key {
					t.Fatalf("event %d: %s at %d, want %s at %d", i, ev.Kv.Key, ev.Kv.ModRevision, acked[i].key, acked[i].rev)
				}
			}
		})
	}
}

// TestFailureWithNothingOpen: a group fails while the writer holds no open
// group and no request is waiting; the writer must still notice, mend the
// pipeline and evaluate the requests of the groups behind it (a lost wake-up
// here hangs their callers). A too-large delete among concurrent puts makes
// the committer hand every request of its group back, one by one.
func TestFailureWithNothingOpen(t *testing.T) {
	for range 30 {
		b := open(t, smallBatches{Store: memkv.New(), max: 50})
		for i := range 40 {
			put(t, b, fmt.Sprintf("/big/%02d", i), "v")
		}
		var wg sync.WaitGroup
		errs := make(chan error, 21)
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := b.Put(context.Background(), &pb.PutRequest{Key: []byte(fmt.Sprintf("/small/%d", i)), Value: []byte("v")})
				errs <- err
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.DeleteRange(context.Background(), &pb.DeleteRangeRequest{Key: []byte("/big/"), RangeEnd: []byte("/big0")})
			if !errors.Is(err, ErrTooLarge) {
				errs <- fmt.Errorf("oversized delete: %v, want ErrTooLarge", err)
			}
		}()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		_ = b.Close()
	}
}

// TestRangeReadAheadStale: a DeleteRange's range read ahead, then a key
// created inside it before the request reached the writer; the writer must
// scan again and delete that key too. A range nobody wrote in since is used.
func TestRangeReadAheadStale(t *testing.T) {
	reg := prometheus.NewRegistry()
	b, err := Open(context.Background(), Options{Store: memkv.New(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	put(t, b, "a/1", "v")
	put(t, b, "z/1", "v")
	del := &pb.TxnRequest{Success: []*pb.RequestOp{delOp("a/", "a0")}}
	r := b.txnRequest(context.Background(), del, false)
	if ar, ok := r.prefetch.lookupRange([]byte("a/"), []byte("a0")); !ok || len(ar.pairs) != 1 {
		t.Fatalf("range read ahead: %+v %v", ar, ok)
	}
	put(t, b, "a/2", "v")
	stale := counterValue(t, b.metrics.prefetch[prefetchStale])
	res, err := b.submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if n := res.txn.Responses[0].GetResponseDeleteRange().Deleted; n != 2 {
		t.Fatalf("deleted %d keys, want 2 (one created after the range was read ahead)", n)
	}
	if got := counterValue(t, b.metrics.prefetch[prefetchStale]); got != stale+1 {
		t.Fatalf("stale reads ahead: %v, want %v", got, stale+1)
	}
	// Writes outside the range do not make it stale.
	put(t, b, "a/3", "v")
	r = b.txnRequest(context.Background(), &pb.TxnRequest{Success: []*pb.RequestOp{delOp("a/", "a0")}}, false)
	put(t, b, "z/2", "v")
	used := counterValue(t, b.metrics.prefetch[prefetchUsed])
	if res, err = b.submit(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if n := res.txn.Responses[0].GetResponseDeleteRange().Deleted; n != 1 {
		t.Fatalf("deleted %d keys, want 1", n)
	}
	if got := counterValue(t, b.metrics.prefetch[prefetchUsed]); got != used+1 {
		t.Fatalf("used reads ahead: %v, want %v", got, used+1)
	}
}
