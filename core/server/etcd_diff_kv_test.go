package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/etcdtest"
)

// Differential tests of compaction's revisions, Range's sorting and limit,
// and RequestProgress beside a compacted watcher, and the pinned refusal
// of an over-long key.

// restartablePair is a pair over an etcd data directory and an Engram
// store that outlive their servers, with Maintenance clients too.
type restartablePair struct {
	*pair
	maint [2]pb.MaintenanceClient
	// restart stops both servers and starts them again on the same data,
	// pointing the clients at the new ones.
	restart func()
}

func newRestartablePair(t *testing.T) (*restartablePair, context.Context) {
	t.Helper()
	etcdtest.Require(t)
	dataDir := t.TempDir() + "/etcd"
	store := memkv.New()
	t.Cleanup(func() { _ = store.Close() })
	// A hang guard, not a measurement.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	p := &restartablePair{pair: &pair{names: [2]string{"etcd", "engram"}}}
	var stop func()
	start := func() {
		e := etcdtest.Start(t, etcdtest.Options{DataDir: dataDir})
		ec, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		g := servertest.Start(t, store, servertest.Options{})
		gc := g.Client(t)
		for i, c := range []*clientv3.Client{ec, gc} {
			p.kv[i] = pb.NewKVClient(c.ActiveConnection())
			p.lease[i] = pb.NewLeaseClient(c.ActiveConnection())
			p.watch[i] = pb.NewWatchClient(c.ActiveConnection())
			p.maint[i] = pb.NewMaintenanceClient(c.ActiveConnection())
		}
		stop = func() {
			_ = ec.Close()
			if err := e.Stop(); err != nil {
				t.Fatal(err)
			}
			g.Stop()
		}
	}
	start()
	p.restart = func() { stop(); start() }
	return p, ctx
}

// hashKV compares HashKV's answers at rev, compact_revision included: etcd
// reports -1 for a store never compacted, 0 for one compacted at 0. (At
// revision 0, right after Compact(0), a live etcd answers from the hash it
// kept while compacting, README's deliberate HashKV difference; hence an
// explicit revision.)
func (p *restartablePair) hashKV(t *testing.T, ctx context.Context, rev int64, what string) {
	t.Helper()
	same(t, p.pair, "hashkv "+what, func(i int) (*pb.HashKVResponse, error) {
		return p.maint[i].HashKV(ctx, &pb.HashKVRequest{Revision: rev})
	}, func(r *pb.HashKVResponse) string {
		return fmt.Sprintf("revision=%d hash=%d compact_revision=%d hash_revision=%d", r.Header.Revision, r.Hash, r.CompactRevision, r.HashRevision)
	})
}

func showHeader(r *pb.CompactionResponse) string { return fmt.Sprint("revision=", r.Header.Revision) }

func (p *pair) compact(t *testing.T, ctx context.Context, rev int64) {
	t.Helper()
	same(t, p, fmt.Sprint("compact ", rev), func(i int) (*pb.CompactionResponse, error) {
		return p.kv[i].Compact(ctx, &pb.CompactionRequest{Revision: rev, Physical: true})
	}, showHeader)
}

func (p *pair) put(t *testing.T, ctx context.Context, key, value string) {
	t.Helper()
	same(t, p, "put "+key, func(i int) (*pb.PutResponse, error) {
		return p.kv[i].Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte(value)})
	}, func(r *pb.PutResponse) string { return fmt.Sprint(r.Header.Revision) })
}

// TestDiffCompactRevisions: etcd's compacted revision starts at -1, so a
// store never compacted accepts Compact(0) and Compact(1) once each and
// refuses negative revisions; once compacted at C it refuses C and below;
// a revision above the current one is a future revision.
func TestDiffCompactRevisions(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	for _, rev := range []int64{-5, -1, 2, 0, 0, -1, 1, 1, 0, 2} {
		p.compact(t, ctx, rev)
	}
	for _, k := range []string{"a", "b", "c"} {
		p.put(t, ctx, k, "v")
	}
	for _, rev := range []int64{3, 3, 2, 5, 4, 4, -1} {
		p.compact(t, ctx, rev)
	}
}

// TestDiffCompactAfterRestart: whether a store was ever compacted survives
// a restart: a store never compacted still accepts Compact(0)
// after one, and one compacted at 0 refuses it after one; HashKV's
// compact_revision tells the two apart too.
func TestDiffCompactAfterRestart(t *testing.T) {
	t.Parallel()
	p, ctx := newRestartablePair(t)
	p.put(t, ctx, "a", "v")
	p.hashKV(t, ctx, 2, "never compacted")
	p.restart()
	p.hashKV(t, ctx, 2, "never compacted, restarted")
	p.compact(t, ctx, -1)
	p.compact(t, ctx, 0)
	p.hashKV(t, ctx, 2, "compacted at 0")
	p.restart()
	p.hashKV(t, ctx, 2, "compacted at 0, restarted")
	p.compact(t, ctx, 0)
	p.compact(t, ctx, 1)
	p.restart()
	p.compact(t, ctx, 1)
	p.compact(t, ctx, 2)
	p.restart()
	p.hashKV(t, ctx, 2, "compacted at 2, restarted")
	p.compact(t, ctx, 2)
	p.put(t, ctx, "b", "v")
	p.compact(t, ctx, 3)
}

// showRange shows everything a Range answers but the cluster's identity.
func showRange(r *pb.RangeResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "revision=%d count=%d more=%v", r.Header.Revision, r.Count, r.More)
	for _, kv := range r.Kvs {
		fmt.Fprintf(&b, " %s(c%d m%d v%d %q)", kv.Key, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Value)
	}
	return b.String()
}

// TestDiffSortAndLimit: etcd's Range sorts with an unstable sort over key
// order, DESCEND being the same sort over the reversed comparison, so the
// order among equal sort keys is its algorithm's; it sorts all
// then cuts to the limit, except with a sort target and sort order NONE and
// no filter, where it reads limit+1 keys in key order, sorts those and
// cuts. Count and More follow. A Txn's Range answers the same.
// The range holds 40 keys, more than a sort of 12 does by insertion (which
// is stable), with equal create, mod and version revisions and values.
func TestDiffSortAndLimit(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	key := func(n int) string { return fmt.Sprintf("k%02d", n) }
	putAll := func(from, to int) {
		var ops []*pb.RequestOp
		for n := from; n < to; n++ {
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
				Key: []byte(key(n)), Value: []byte(fmt.Sprint("v", (n*7)%3)),
			}}})
		}
		same(t, p, fmt.Sprint("txn put ", from, "-", to), func(i int) (*pb.TxnResponse, error) {
			return p.kv[i].Txn(ctx, &pb.TxnRequest{Success: ops})
		}, showTxn)
	}
	putAll(0, 20)
	putAll(20, 40)
	putAll(5, 9)
	putAll(30, 33)
	p.put(t, ctx, key(7), "v9")
	p.put(t, ctx, key(1), "v0")
	p.put(t, ctx, "a", "outside")
	targets := []pb.RangeRequest_SortTarget{pb.RangeRequest_KEY, pb.RangeRequest_VERSION, pb.RangeRequest_CREATE, pb.RangeRequest_MOD, pb.RangeRequest_VALUE}
	orders := []pb.RangeRequest_SortOrder{pb.RangeRequest_NONE, pb.RangeRequest_ASCEND, pb.RangeRequest_DESCEND}
	for _, target := range targets {
		for _, order := range orders {
			for _, limit := range []int64{0, 1, 3, 20, 39, 40, 41} {
				for _, v := range []struct {
					name string
					mod  func(*pb.RangeRequest)
				}{
					{"", func(*pb.RangeRequest) {}},
					{" from key", func(r *pb.RangeRequest) { r.RangeEnd = []byte{0} }},
					{" min mod 3", func(r *pb.RangeRequest) { r.MinModRevision = 3 }},
					{" keys only", func(r *pb.RangeRequest) { r.KeysOnly = true }},
					{" count only", func(r *pb.RangeRequest) { r.CountOnly = true }},
				} {
					req := &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), Limit: limit, SortTarget: target, SortOrder: order}
					v.mod(req)
					what := fmt.Sprintf("range %s %s limit %d%s", target, order, limit, v.name)
					same(t, p, what, func(i int) (*pb.RangeResponse, error) { return p.kv[i].Range(ctx, req) }, showRange)
					same(t, p, "txn "+what, func(i int) (*pb.RangeResponse, error) {
						r, err := p.kv[i].Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: req}}}})
						if err != nil {
							return nil, err
						}
						return r.Responses[0].GetResponseRange(), nil
					}, showRange)
				}
			}
		}
	}
}

func progressRequest() *pb.WatchRequest {
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}
}

func cancelWatch(id int64) *pb.WatchRequest {
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: id}}}
}

// send sends req on both streams without waiting for an answer.
func (w watchPair) send(t *testing.T, req *pb.WatchRequest) {
	t.Helper()
	for i := range 2 {
		if err := w[i].Send(req); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDiffProgressBesideCompactedWatcher: etcd never answers a
// RequestProgress on a stream without watchers. A watcher a compaction
// cancelled stays on its stream until the client cancels it: meanwhile its
// ID stays taken and etcd drops every RequestProgress, never answering it,
// not even once the client cancelled the watcher; the cancel itself is
// confirmed, and requests after it are answered. Each dropped request is
// followed by a request etcd answers, whose answer must come next.
func TestDiffProgressBesideCompactedWatcher(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	for _, k := range []string{"a", "b", "c"} {
		p.put(t, ctx, k, "v")
	}
	p.compact(t, ctx, 4)
	w := p.watchStreams(t, ctx)
	w.send(t, progressRequest()) // no watcher on the stream: no answer
	w.exchange(t, p, "create 5 from revision 2", createWatch(&pb.WatchCreateRequest{Key: []byte("a"), StartRevision: 2, WatchId: 5}))
	same(t, p, "the compaction's cancel", func(i int) (*pb.WatchResponse, error) { return w[i].Recv() }, showWatch)
	w.send(t, progressRequest())
	w.exchange(t, p, "create after a dropped progress request", createWatch(&pb.WatchCreateRequest{Key: []byte("z")}))
	w.exchange(t, p, "create with the compacted watcher's ID", createWatch(&pb.WatchCreateRequest{Key: []byte("y"), WatchId: 5}))
	w.send(t, progressRequest())
	w.exchange(t, p, "cancel the compacted watcher", cancelWatch(5))
	w.send(t, cancelWatch(5)) // unknown by now: no answer
	w.exchange(t, p, "progress once it is gone", progressRequest())
	p.put(t, ctx, "z", "v")
	same(t, p, "the event", func(i int) (*pb.WatchResponse, error) { return w[i].Recv() }, showWatch)
	w.exchange(t, p, "progress after the event", progressRequest())
	w.exchange(t, p, "create an auto ID", createWatch(&pb.WatchCreateRequest{Key: []byte("x")}))
}

// TestKeyOverLimitMessage pins Engram's refusal of a key over its 32 KiB
// limit (a deliberate difference: etcd bounds only the request's
// size): every request carrying the key is refused with InvalidArgument
// naming the key's size, its size with 0x00 bytes counted twice (the
// engines' encoding doubles them) and the limit; a watch is refused the way
// etcd refuses a watch it cannot start, under watch ID -1.
func TestKeyOverLimitMessage(t *testing.T) {
	t.Parallel()
	c := servertest.Start(t, memkv.New(), servertest.Options{}).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kvc := pb.NewKVClient(c.ActiveConnection())
	for _, k := range []struct {
		key  []byte
		want string
	}{
		{[]byte(strings.Repeat("k", 32<<10+1)), "engram: key of 32769 bytes (32769 with 0x00 bytes counted twice) exceeds the limit of 32768 bytes"},
		{append([]byte("k"), make([]byte, 16<<10)...), "engram: key of 16385 bytes (32769 with 0x00 bytes counted twice) exceeds the limit of 32768 bytes"},
	} {
		put := &pb.PutRequest{Key: k.key, Value: []byte("v")}
		rng := &pb.RangeRequest{Key: k.key}
		del := &pb.DeleteRangeRequest{Key: k.key}
		op := func(r any) *pb.TxnRequest {
			switch r := r.(type) {
			case *pb.PutRequest:
				return &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: r}}}}
			case *pb.RangeRequest:
				return &pb.TxnRequest{Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: r}}}}
			default:
				return &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
					Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: del}}}}}}}}
			}
		}
		for what, call := range map[string]func() error{
			"put":         func() error { _, err := kvc.Put(ctx, put); return err },
			"range":       func() error { _, err := kvc.Range(ctx, rng); return err },
			"delete":      func() error { _, err := kvc.DeleteRange(ctx, del); return err },
			"txn put":     func() error { _, err := kvc.Txn(ctx, op(put)); return err },
			"txn range":   func() error { _, err := kvc.Txn(ctx, op(rng)); return err },
			"nested del":  func() error { _, err := kvc.Txn(ctx, op(del)); return err },
			"txn compare": func() error { _, err := kvc.Txn(ctx, &pb.TxnRequest{Compare: []*pb.Compare{{Key: k.key}}}); return err },
		} {
			err := call()
			if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || st.Message() != k.want {
				t.Errorf("%s: %v, want InvalidArgument %q", what, err, k.want)
			}
		}
		ws, err := pb.NewWatchClient(c.ActiveConnection()).Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := ws.Send(createWatch(&pb.WatchCreateRequest{Key: k.key})); err != nil {
			t.Fatal(err)
		}
		r, err := ws.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.WatchId != -1 || !r.Created || !r.Canceled || r.CancelReason != k.want {
			t.Errorf("watch: %s, want watch ID -1, created and canceled with %q", showWatch(r), k.want)
		}
	}
}

// TestDiffProgressBesideFutureWatcher: etcd drops a RequestProgress while
// any watcher on the stream asked to start above the store's revision (it
// is not synced until then), a watch from head+1 included; once a write
// reaches the start, requests are answered again.
func TestDiffProgressBesideFutureWatcher(t *testing.T) {
	t.Parallel()
	p, ctx := newPair(t)
	p.put(t, ctx, "a", "v") // revision 2
	w := p.watchStreams(t, ctx)
	w.exchange(t, p, "create from the current revision", createWatch(&pb.WatchCreateRequest{Key: []byte("a"), StartRevision: 2}))
	same(t, p, "its replayed event", func(i int) (*pb.WatchResponse, error) { return w[i].Recv() }, showWatch)
	w.exchange(t, p, "progress with a synced watcher", progressRequest())
	w.exchange(t, p, "create from head+1", createWatch(&pb.WatchCreateRequest{Key: []byte("b"), StartRevision: 3}))
	w.send(t, progressRequest()) // a watcher waits for revision 3: dropped
	w.exchange(t, p, "create from revision 5", createWatch(&pb.WatchCreateRequest{Key: []byte("c"), StartRevision: 5}))
	p.put(t, ctx, "x", "v") // revision 3: watcher c still waits for 5
	w.send(t, progressRequest())
	w.exchange(t, p, "cancel the watcher from revision 5", cancelWatch(2))
	w.exchange(t, p, "progress once every start is reached", progressRequest())
}
