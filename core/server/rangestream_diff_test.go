package server_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/etcdtest"
)

// Differential tests of etcd 3.7's KV.RangeStream: the same raw requests to a real etcd 3.7.0 and to Engram, the
// whole sequence of chunks compared (each chunk's key-values, the final
// header revision, More and Count) and errors compared by code and
// message. Only the header's cluster ID, member ID and raft term are left
// out, as they must differ.

// newPair37 is newPair with etcd 3.7 as the oracle and Engram over store
// (memkv.New() for a fresh in-memory one).
func newPair37(t *testing.T, store kv.Store) (*pair, context.Context) {
	t.Helper()
	e := etcdtest.Start(t, etcdtest.Options{Release: etcdtest.Release37})
	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ec.Close() })
	gc := servertest.Start(t, store, servertest.Options{}).Client(t)
	// A hang guard, not a measurement.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	p := &pair{names: [2]string{"etcd 3.7", "engram"}}
	for i, c := range []*clientv3.Client{ec, gc} {
		p.kv[i] = pb.NewKVClient(c.ActiveConnection())
		p.lease[i] = pb.NewLeaseClient(c.ActiveConnection())
		p.watch[i] = pb.NewWatchClient(c.ActiveConnection())
	}
	return p, ctx
}

// putStream writes key (with a lease) on both servers and checks they answered alike.
func (p *pair) putStream(t *testing.T, ctx context.Context, key string, value []byte, lease int64) {
	t.Helper()
	same(t, p, "put "+key, func(i int) (*pb.PutResponse, error) {
		return p.kv[i].Put(ctx, &pb.PutRequest{Key: []byte(key), Value: value, Lease: lease})
	}, func(r *pb.PutResponse) string { return fmt.Sprint(r.Header.Revision) })
}

// streamChunks runs RangeStream on server i and describes every chunk,
// then the error that ended the stream if it was not a clean end. between
// (if set) runs after each chunk but the last one received, on the same
// server, before the next chunk is asked for.
func (p *pair) streamChunks(ctx context.Context, i int, req *pb.RangeRequest, between func(i, chunk int)) string {
	s, err := p.kv[i].RangeStream(ctx, req)
	if err != nil {
		return describeStreamErr(err)
	}
	var b strings.Builder
	for n := 0; ; n++ {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return b.String()
		}
		if err != nil {
			return b.String() + describeStreamErr(err)
		}
		fmt.Fprintf(&b, "chunk %d: %s\n", n, showChunk(m.RangeResponse))
		if between != nil {
			between(i, n)
		}
	}
}

func describeStreamErr(err error) string {
	st, _ := status.FromError(err)
	return fmt.Sprintf("error %s: %s\n", st.Code(), st.Message())
}

// showChunk describes a chunk: its header (revision only), More, Count and
// key-values, listed one by one when few and by their first and last key
// and a hash of all fields when many.
func showChunk(r *pb.RangeResponse) string {
	if r == nil {
		return "no range_response"
	}
	var b strings.Builder
	if r.Header != nil {
		fmt.Fprintf(&b, "header{revision=%d} ", r.Header.Revision)
	}
	fmt.Fprintf(&b, "more=%v count=%d kvs=%d", r.More, r.Count, len(r.Kvs))
	if len(r.Kvs) <= 30 {
		for _, kv := range r.Kvs {
			b.WriteString(" " + showKV(kv))
		}
		return b.String()
	}
	h := fnv.New64a()
	for _, kv := range r.Kvs {
		h.Write([]byte(showKV(kv)))
		h.Write(kv.Value)
	}
	fmt.Fprintf(&b, " [%s .. %s] hash=%x", showKV(r.Kvs[0]), showKV(r.Kvs[len(r.Kvs)-1]), h.Sum64())
	return b.String()
}

func showKV(kv *mvccpb.KeyValue) string {
	h := fnv.New32a()
	h.Write(kv.Value)
	return fmt.Sprintf("%s@c%d/m%d/v%d/l%d/%dB:%x", kv.Key, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease, len(kv.Value), h.Sum32())
}

// sameStream runs req as RangeStream on both servers and compares the
// chunk sequences.
func (p *pair) sameStream(t *testing.T, ctx context.Context, what string, req *pb.RangeRequest, between func(i, chunk int)) {
	t.Helper()
	same(t, p, what, func(i int) (string, error) { return p.streamChunks(ctx, i, req, between), nil }, func(s string) string { return s })
}

// value is a deterministic value of n bytes for key.
func value(key string, n int) []byte {
	v := make([]byte, n)
	h := fnv.New64a()
	h.Write([]byte(key))
	x := h.Sum64() | 1
	for i := range v {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		v[i] = 'a' + byte(x%26)
	}
	return v
}

func prefixRange(prefix string) (key, end []byte) {
	return []byte(prefix), []byte(prefix[:len(prefix)-1] + string(prefix[len(prefix)-1]+1))
}

// TestDiffRangeStream compares RangeStream's chunks over ranges of 0, 1,
// 10, 11, 25 and 1000 keys and over keys with large values (chunks that
// shrink), with limits, sort targets, keys_only, count_only, explicit
// revisions and malformed requests.
func TestDiffRangeStream(t *testing.T) {
	t.Parallel()
	p, ctx := newPair37(t, memkv.New())
	sizes := []int{0, 1, 10, 11, 25, 1000}
	for _, n := range sizes {
		// Written in reverse key order, so mod and create revisions run
		// against key order and a sort by them shows.
		for k := n - 1; k >= 0; k-- {
			key := fmt.Sprintf("n%d/%04d", n, k)
			p.putStream(t, ctx, key, value(key, 64+k%200), 0)
		}
	}
	// Some keys changed again, so versions and mod revisions vary.
	for k := 0; k < 25; k += 3 {
		key := fmt.Sprintf("n25/%04d", k)
		p.putStream(t, ctx, key, value(key+"again", 10), 0)
	}
	// Values of 400 KiB: a 10-key chunk encodes to more than twice the
	// request size limit, so etcd halves the next chunk.
	for k := range 20 {
		key := fmt.Sprintf("big/%02d", k)
		p.putStream(t, ctx, key, value(key, 400<<10), 0)
	}
	var lease [2]int64
	for i := range 2 {
		r, err := p.lease[i].LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: 7, TTL: 600})
		if err != nil {
			t.Fatal(err)
		}
		lease[i] = r.ID
	}
	for k := range 12 {
		key := fmt.Sprintf("leased/%02d", k)
		p.putStream(t, ctx, key, value(key, 8), lease[0])
	}
	p.putStream(t, ctx, "z/last", []byte("z"), 0)

	for _, n := range sizes {
		key, end := prefixRange(fmt.Sprintf("n%d/", n))
		p.sameStream(t, ctx, fmt.Sprintf("%d keys", n), &pb.RangeRequest{Key: key, RangeEnd: end}, nil)
		p.sameStream(t, ctx, fmt.Sprintf("%d keys, keys only", n), &pb.RangeRequest{Key: key, RangeEnd: end, KeysOnly: true}, nil)
		p.sameStream(t, ctx, fmt.Sprintf("%d keys, count only", n), &pb.RangeRequest{Key: key, RangeEnd: end, CountOnly: true}, nil)
	}
	key25, end25 := prefixRange("n25/")
	for _, limit := range []int64{1, 5, 10, 11, 15, 20, 25, 30, -1, -20} {
		p.sameStream(t, ctx, fmt.Sprintf("25 keys, limit %d", limit), &pb.RangeRequest{Key: key25, RangeEnd: end25, Limit: limit}, nil)
		p.sameStream(t, ctx, fmt.Sprintf("25 keys, limit %d, count only", limit), &pb.RangeRequest{Key: key25, RangeEnd: end25, Limit: limit, CountOnly: true}, nil)
	}
	key1000, end1000 := prefixRange("n1000/")
	for _, limit := range []int64{500, 999, 1000, 1001} {
		p.sameStream(t, ctx, fmt.Sprintf("1000 keys, limit %d", limit), &pb.RangeRequest{Key: key1000, RangeEnd: end1000, Limit: limit}, nil)
	}
	for target := range int32(5) {
		for order := range int32(4) {
			for _, limit := range []int64{0, 7} {
				req := &pb.RangeRequest{Key: key25, RangeEnd: end25, Limit: limit,
					SortTarget: pb.RangeRequest_SortTarget(target), SortOrder: pb.RangeRequest_SortOrder(order)}
				p.sameStream(t, ctx, fmt.Sprintf("25 keys, sort target %d order %d limit %d", target, order, limit), req, nil)
			}
		}
	}
	bigKey, bigEnd := prefixRange("big/")
	p.sameStream(t, ctx, "large values", &pb.RangeRequest{Key: bigKey, RangeEnd: bigEnd}, nil)
	p.sameStream(t, ctx, "large values, keys only", &pb.RangeRequest{Key: bigKey, RangeEnd: bigEnd, KeysOnly: true}, nil)
	leasedKey, leasedEnd := prefixRange("leased/")
	p.sameStream(t, ctx, "leased keys", &pb.RangeRequest{Key: leasedKey, RangeEnd: leasedEnd}, nil)
	p.sameStream(t, ctx, "leased keys, keys only", &pb.RangeRequest{Key: leasedKey, RangeEnd: leasedEnd, KeysOnly: true}, nil)
	p.sameStream(t, ctx, "leased keys, keys only, sort target VALUE",
		&pb.RangeRequest{Key: leasedKey, RangeEnd: leasedEnd, KeysOnly: true, SortTarget: pb.RangeRequest_VALUE}, nil)
	p.sameStream(t, ctx, "one present key", &pb.RangeRequest{Key: []byte("n25/0003")}, nil)
	p.sameStream(t, ctx, "one missing key", &pb.RangeRequest{Key: []byte("n25/")}, nil)
	p.sameStream(t, ctx, "from key", &pb.RangeRequest{Key: []byte("n25/0020"), RangeEnd: []byte{0}}, nil)
	p.sameStream(t, ctx, "whole keyspace, keys only", &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, KeysOnly: true}, nil)
	p.sameStream(t, ctx, "end before key", &pb.RangeRequest{Key: []byte("n25/0020"), RangeEnd: []byte("n25/0010")}, nil)

	// Malformed and refused requests.
	p.sameStream(t, ctx, "empty key", &pb.RangeRequest{}, nil)
	p.sameStream(t, ctx, "empty key with an end", &pb.RangeRequest{RangeEnd: []byte("z")}, nil)
	p.sameStream(t, ctx, "unknown sort order", &pb.RangeRequest{Key: key25, RangeEnd: end25, SortOrder: 9}, nil)
	p.sameStream(t, ctx, "unknown sort target", &pb.RangeRequest{Key: key25, RangeEnd: end25, SortTarget: 9}, nil)
	p.sameStream(t, ctx, "unknown target, descending", &pb.RangeRequest{Key: key25, RangeEnd: end25, SortTarget: 9, SortOrder: 2}, nil)
	for name, req := range map[string]*pb.RangeRequest{
		"min mod":    {MinModRevision: 3},
		"max mod":    {MaxModRevision: 30},
		"min create": {MinCreateRevision: 3},
		"max create": {MaxCreateRevision: 30},
	} {
		req.Key, req.RangeEnd = key25, end25
		p.sameStream(t, ctx, "revision filter "+name, req, nil)
		req.CountOnly = true
		p.sameStream(t, ctx, "revision filter "+name+", count only", req, nil)
	}
	// A read is never proposed to raft, so etcd does not apply its request
	// size limit to it: only the transport's limit (the size limit plus
	// 512 KiB) refuses one.
	p.sameStream(t, ctx, "request over the size limit", &pb.RangeRequest{Key: key25, RangeEnd: append([]byte("n25/"), make([]byte, 1600<<10)...)}, nil)
	p.sameStream(t, ctx, "request over the transport limit", &pb.RangeRequest{Key: key25, RangeEnd: append([]byte("n25/"), make([]byte, 2200<<10)...)}, nil)

	// Explicit revisions: past ones (half of the 25 keys written, all of
	// them before their second writes, some rewritten), a negative one (the current revision, for every chunk),
	// the current one and a future one.
	var cur int64
	same(t, p, "current revision", func(i int) (int64, error) {
		r, err := p.kv[i].Range(ctx, &pb.RangeRequest{Key: []byte("z/last")})
		if err != nil {
			return 0, err
		}
		cur = r.Header.Revision
		return cur, nil
	}, func(r int64) string { return fmt.Sprint(r) })
	for _, rev := range []int64{36, 48, 1050, -1, cur, cur + 1} {
		p.sameStream(t, ctx, fmt.Sprintf("25 keys at revision %d", rev), &pb.RangeRequest{Key: key25, RangeEnd: end25, Revision: rev}, nil)
		p.sameStream(t, ctx, fmt.Sprintf("25 keys at revision %d, count only", rev), &pb.RangeRequest{Key: key25, RangeEnd: end25, Revision: rev, CountOnly: true}, nil)
	}
}

// TestDiffRangeStreamPinnedAndCompacted: a stream keeps the first chunk's
// revision while keys in its range change, appear and disappear between
// chunks, both when the request named no revision and when it named one;
// a compacted revision is refused, the compaction revision itself is not.
// (A compaction between chunks also ends a stream with etcd's error, but
// after how many chunks depends on how far the server ran ahead of the
// client, so that is not compared.)
//
// It runs on each engine (memkv and badger): reads at a past revision
// resolve through each engine's history.
func TestDiffRangeStreamPinnedAndCompacted(t *testing.T) {
	t.Parallel()
	for _, e := range rangeStreamEngines {
		t.Run(e.name, func(t *testing.T) {
			p, ctx := newPair37(t, e.open(t))
			diffPinnedAndCompacted(t, p, ctx)
		})
	}
}

// rangeStreamEngines are the stores the RangeStream tests run Engram on.
var rangeStreamEngines = []struct {
	name string
	open func(t *testing.T) kv.Store
}{
	{"memkv", func(t *testing.T) kv.Store {
		s := memkv.New()
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
	{"badger", func(t *testing.T) kv.Store {
		s, err := badger.Open(badger.Options{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
}

func diffPinnedAndCompacted(t *testing.T, p *pair, ctx context.Context) {
	// 1000 keys of 2 KiB: the stream has several chunks and megabytes in
	// flight, so gRPC's flow control holds the server back while the client
	// writes between chunks, and writes land between the server's chunk
	// reads. The comparison holds whatever the timing: a stream that did
	// not keep its revision would show some of the writes.
	for k := range 1000 {
		key := fmt.Sprintf("p/%04d", k)
		p.putStream(t, ctx, key, value(key, 2<<10), 0)
	}
	key, end := prefixRange("p/")
	writes := func(i, chunk int) {
		for k := range 5 {
			n := 100*chunk + 37*k + 300
			key := fmt.Sprintf("p/%04d", n%1000)
			if _, err := p.kv[i].Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte("changed")}); err != nil {
				t.Errorf("%s: %v", p.names[i], err)
			}
			if _, err := p.kv[i].DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte(fmt.Sprintf("p/%04d", (n+1)%1000))}); err != nil {
				t.Errorf("%s: %v", p.names[i], err)
			}
			if _, err := p.kv[i].Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("p/%04d/new", n%1000)), Value: []byte("new")}); err != nil {
				t.Errorf("%s: %v", p.names[i], err)
			}
		}
	}
	var before [2]string
	for i := range 2 {
		// What the range held before the stream, for the check below.
		r, err := p.kv[i].Range(ctx, &pb.RangeRequest{Key: key, RangeEnd: end})
		if err != nil {
			t.Fatal(err)
		}
		before[i] = fmt.Sprintf("header{revision=%d} more=false count=%d kvs=%d", r.Header.Revision, r.Count, len(r.Kvs))
	}
	p.sameStream(t, ctx, "stream while writing", &pb.RangeRequest{Key: key, RangeEnd: end}, writes)
	p.sameStream(t, ctx, "stream at revision 500 while writing", &pb.RangeRequest{Key: key, RangeEnd: end, Revision: 500}, writes)
	p.sameStream(t, ctx, "stream with limit 700 while writing", &pb.RangeRequest{Key: key, RangeEnd: end, Limit: 700}, writes)
	// The first stream, merged, is the range as it was before it began.
	for i := range 2 {
		rev := int64(1001)
		s, err := p.kv[i].RangeStream(ctx, &pb.RangeRequest{Key: key, RangeEnd: end, Revision: rev})
		if err != nil {
			t.Fatal(err)
		}
		n, last := 0, (*pb.RangeResponse)(nil)
		for {
			m, err := s.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", p.names[i], err)
			}
			n += len(m.RangeResponse.Kvs)
			last = m.RangeResponse
		}
		if got := fmt.Sprintf("count=%d kvs=%d", last.Count, n); !strings.HasSuffix(before[i], got) {
			t.Errorf("%s: stream at revision %d gave %s; the range then: %s", p.names[i], rev, got, before[i])
		}
	}

	same(t, p, "compact", func(i int) (*pb.CompactionResponse, error) {
		return p.kv[i].Compact(ctx, &pb.CompactionRequest{Revision: 600})
	}, func(r *pb.CompactionResponse) string { return fmt.Sprint(r.Header.Revision) })
	for _, rev := range []int64{1, 599, 600, 601} {
		p.sameStream(t, ctx, fmt.Sprintf("at revision %d after compacting at 600", rev), &pb.RangeRequest{Key: key, RangeEnd: end, Revision: rev, Limit: 30}, nil)
		p.sameStream(t, ctx, fmt.Sprintf("count at revision %d after compacting at 600", rev), &pb.RangeRequest{Key: key, RangeEnd: end, Revision: rev, CountOnly: true}, nil)
	}
}

// TestRangeStreamClientV3 reads through clientv3 3.7's own streaming call
// (GetStream) on each engine: merged, the chunks are what Get answers at
// the stream's revision, for a whole range, a limited one, keys only, a
// past revision and a count. The client writes to the range between chunks;
// whether a write lands between the server's chunk reads depends on how far
// the server ran ahead (TestDiffRangeStreamPinnedAndCompacted makes that
// likely with more data in flight).
func TestRangeStreamClientV3(t *testing.T) {
	t.Parallel()
	for _, e := range rangeStreamEngines {
		t.Run(e.name, func(t *testing.T) {
			c := servertest.Start(t, e.open(t), servertest.Options{}).Client(t)
			// A hang guard, not a measurement.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			for k := range 600 {
				key := fmt.Sprintf("c/%04d", k)
				if _, err := c.Put(ctx, key, string(value(key, 1<<10))); err != nil {
					t.Fatal(err)
				}
			}
			for _, tc := range []struct {
				rev  int64 // 0: the stream's
				opts []clientv3.OpOption
			}{
				{0, []clientv3.OpOption{clientv3.WithPrefix()}},
				{0, []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithLimit(250)}},
				{0, []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly()}},
				{300, []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(300)}},
				{0, []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}},
			} {
				opts := tc.opts
				ch, err := c.GetStream(ctx, "c/", opts...)
				if err != nil {
					t.Fatal(err)
				}
				merged := &pb.RangeResponse{}
				chunks := 0
				for r := range ch {
					if err := r.Err(); err != nil {
						t.Fatal(err)
					}
					chunks++
					merged.Kvs = append(merged.Kvs, r.Kvs...)
					if r.Header != nil {
						merged.Header, merged.More, merged.Count = r.Header, r.More, r.Count
					}
					// Changes the stream must not show.
					key := fmt.Sprintf("c/%04d", (chunks*97)%600)
					if _, err := c.Put(ctx, key, "changed"); err != nil {
						t.Fatal(err)
					}
					if _, err := c.Put(ctx, key+"/new", "new"); err != nil {
						t.Fatal(err)
					}
				}
				rev := tc.rev
				if rev == 0 {
					rev = merged.Header.Revision
				}
				want, err := c.Get(ctx, "c/", append(opts, clientv3.WithRev(rev))...)
				if err != nil {
					t.Fatal(err)
				}
				got := fmt.Sprintf("more=%v count=%d kvs=%d", merged.More, merged.Count, len(merged.Kvs))
				exp := fmt.Sprintf("more=%v count=%d kvs=%d", want.More, want.Count, len(want.Kvs))
				for i := range min(len(merged.Kvs), len(want.Kvs)) {
					if a, b := showKV(merged.Kvs[i]), showKV(want.Kvs[i]); a != b {
						t.Errorf("key-value %d: stream %s, get %s", i, a, b)
						break
					}
				}
				if got != exp {
					t.Errorf("stream (%d chunks) %s, get %s", chunks, got, exp)
				}
			}
		})
	}
}
