package etcddiff

import (
	"fmt"
	"math/rand/v2"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// The generator draws requests from a small key space, so that writes,
// reads, compares and watches keep meeting the same keys, and it keeps a
// model of the oracle's state (revision, compaction, leases, watchers),
// learnt from the oracle's answers only, to aim at the interesting cases:
// past and compacted revisions, live and revoked leases, active watch IDs.

// classes are the operation classes ENGRAM_DIFF_SKIP can leave out.
var classes = []string{
	"range", "sort", "range-rev", "put", "delete", "txn", "txn-nested", "txn-big",
	"compare-unknown", "lease", "lease-list", "lease-ttl", "keepalive", "compact", "watch", "watch-past", "watch-future", "watch-negative",
	"progress", "malformed", "big-value", "big-key",
}

// lidFunc maps a lease ID as the oracle knows it to the server's own; the
// identity for the oracle and for IDs the client chose.
type lidFunc func(int64) int64

// op is one generated request.
type op struct {
	class string
	// build makes the request (a fresh one per server) with lease IDs
	// mapped by lid.
	build func(lid lidFunc) any
	// stream is the watch stream a watch request goes to.
	stream int
	// ctrl: the watch request is answered by one control response
	// (created, refused or canceled), read before anything else.
	ctrl bool
	// catchUp: a watcher created from a past revision, which etcd syncs
	// from its history in the background (every 100 ms), so the stream
	// answers progress requests only once it has caught up.
	catchUp bool
}

func (o *op) String() string {
	r := o.build(func(id int64) int64 { return id })
	s := fmt.Sprintf("%T{%v}", r, r)
	if o.stream >= 0 && strings.Contains(s, "Watch") {
		s = fmt.Sprintf("stream %d: %s", o.stream, s)
	}
	return clip(s, 2000)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("...(%d bytes)", len(s))
}

const nStreams = 3

type streamModel struct {
	open bool
	// active maps the watch IDs created and not canceled to their
	// watchers.
	active map[int64]watcher
	// dirty: a write may have sent events not read yet.
	dirty bool
}

type watcher struct {
	// start is the start revision: etcd answers no progress request on
	// the stream while a watcher starts ahead of the store.
	start int64
	keys  span
}

// blocked reports whether a watcher of the stream starts ahead of rev.
func (sm *streamModel) blocked(rev int64) bool {
	for _, w := range sm.active {
		if w.start > rev {
			return true
		}
	}
	return false
}

type gen struct {
	r    *rand.Rand
	skip map[string]bool

	rev, compacted int64
	leases         []int64 // live leases, as the oracle names them
	revoked        []int64
	streams        [nStreams]streamModel
	keys           [][]byte
}

func newGen(seed uint64, skip map[string]bool) *gen {
	g := &gen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), skip: skip, rev: 1}
	for i := range g.streams {
		g.streams[i].active = map[int64]watcher{}
	}
	// About 50 keys with shared prefixes, 0x00 and 0xff bytes, and one of
	// 32 KiB (Engram's deliberate key limit; etcd bounds only requests).
	for _, k := range []string{
		"a", "a/", "a/b", "a/b/c", "a/c", "a0", "ab", "abc", "b", "b/",
		"b/1", "b/2", "b/3", "c", "foo", "foo/", "foo/bar", "foo/baz", "foo/bar/x", "foo0",
		"fop", "k", "k1", "k2", "k3", "key", "key/a", "key/b", "x", "y",
		"z", "zz", "\x00", "\x00\x00", "\x00a", "a\x00", "a\x00b", "a\xff", "\xff", "\xff\xff",
		"\xff\x00", "foo\x00", "foo\xff", "b\xff\xff", "m", "m/1", "m/2", "n", "\x01", "~",
	} {
		g.keys = append(g.keys, []byte(k))
	}
	return g
}

func (g *gen) on(class string) bool { return !g.skip[class] }

// chance is true with probability p percent.
func (g *gen) chance(p float64) bool { return g.r.Float64()*100 < p }

func (g *gen) key() []byte {
	if g.on("big-key") && g.chance(0.3) {
		return []byte("big/" + strings.Repeat("k", 32<<10-4))
	}
	return g.keys[g.r.IntN(len(g.keys))]
}

// prefixEnd is clientv3's prefix range end: the key with its last byte
// below 0xff incremented and what follows dropped; "\x00" (from the key on)
// when every byte is 0xff.
func prefixEnd(k []byte) []byte {
	end := append([]byte(nil), k...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}

// rangeEnd picks a range end for key: none (the key alone), "\x00" (every
// key from it), its prefix end, another key of the pool (often below it:
// an empty range) or the key itself.
func (g *gen) rangeEnd(key []byte) []byte {
	switch n := g.r.IntN(10); {
	case n < 3:
		return nil
	case n < 5:
		return []byte{0}
	case n < 8:
		return prefixEnd(key)
	case n < 9:
		return g.key()
	default:
		return append([]byte(nil), key...)
	}
}

func (g *gen) value() []byte {
	if g.on("big-value") && g.chance(0.2) {
		// Large but under both servers' 1.5 MiB request limit.
		return []byte(strings.Repeat("v", 256<<10+g.r.IntN(512<<10)))
	}
	n := g.r.IntN(12)
	v := make([]byte, n)
	for i := range v {
		v[i] = "abcv\x00\xff"[g.r.IntN(6)]
	}
	return v
}

// revision picks a revision to read or watch at: 0, the current one, a
// past one, a future one, a compacted one or a negative one.
func (g *gen) revision() int64 {
	switch n := g.r.IntN(12); {
	case n < 4:
		return 0
	case n < 6:
		return g.rev
	case n < 9:
		return g.compacted + g.r.Int64N(g.rev-g.compacted+1)
	case n < 10:
		return g.rev + 1 + g.r.Int64N(2)
	case n < 11:
		if g.compacted > 1 {
			return 1 + g.r.Int64N(g.compacted-1)
		}
		return 1
	default:
		return -1 - g.r.Int64N(2)
	}
}

// lease picks a lease ID for a Put or compare: mostly none, else a live
// one, a revoked one or one never granted.
func (g *gen) lease() int64 {
	switch n := g.r.IntN(10); {
	case n < 6:
		return 0
	case n < 9 && len(g.leases) > 0:
		return g.leases[g.r.IntN(len(g.leases))]
	case n < 9 && len(g.revoked) > 0:
		return g.revoked[g.r.IntN(len(g.revoked))]
	default:
		return 1000 + g.r.Int64N(3)
	}
}

// next draws the next operation.
func (g *gen) next() *op {
	for {
		n := g.r.IntN(100)
		var o *op
		switch {
		case n < 22:
			o = g.rangeOp()
		case n < 40:
			o = g.putOp()
		case n < 46:
			o = g.deleteOp()
		case n < 66:
			o = g.txnOp()
		case n < 78:
			o = g.leaseOp()
		case n < 80:
			o = g.compactOp()
		case n < 97:
			o = g.watchOp()
		default:
			o = g.malformedOp()
		}
		if o != nil && g.on(o.class) {
			return o
		}
	}
}

func noStream(o *op) *op { o.stream = -1; return o }

func (g *gen) rangeReq() *pb.RangeRequest {
	key := g.key()
	r := &pb.RangeRequest{Key: key, RangeEnd: g.rangeEnd(key)}
	if g.chance(40) {
		r.Limit = int64(g.r.IntN(5))
	}
	if g.on("sort") && g.chance(30) {
		r.SortOrder = pb.RangeRequest_SortOrder(g.r.IntN(3))
		r.SortTarget = pb.RangeRequest_SortTarget(g.r.IntN(5))
	}
	if g.on("range-rev") && g.chance(30) {
		r.Revision = g.revision()
	}
	r.KeysOnly = g.chance(15)
	r.CountOnly = g.chance(10)
	r.Serializable = g.chance(20)
	if g.chance(10) {
		r.MinModRevision = g.r.Int64N(g.rev + 2)
	}
	if g.chance(10) {
		r.MaxModRevision = g.r.Int64N(g.rev + 2)
	}
	if g.chance(10) {
		r.MinCreateRevision = g.r.Int64N(g.rev + 2)
	}
	if g.chance(10) {
		r.MaxCreateRevision = g.r.Int64N(g.rev + 2)
	}
	return r
}

func (g *gen) rangeOp() *op {
	r := g.rangeReq()
	class := "range"
	if r.SortTarget != 0 || r.SortOrder != 0 {
		class = "sort"
	}
	return noStream(&op{class: class, build: func(lidFunc) any { return r }})
}

// putReq returns a builder: a Put's lease is mapped per server.
func (g *gen) putReq() func(lidFunc) *pb.PutRequest {
	key, val, lease := g.key(), g.value(), g.lease()
	prev, ignV, ignL := g.chance(30), g.chance(8), g.chance(8)
	if ignV {
		val = nil
	}
	return func(lid lidFunc) *pb.PutRequest {
		return &pb.PutRequest{Key: key, Value: val, Lease: lid(lease), PrevKv: prev, IgnoreValue: ignV, IgnoreLease: ignL}
	}
}

func (g *gen) putOp() *op {
	b := g.putReq()
	return noStream(&op{class: "put", build: func(lid lidFunc) any { return b(lid) }})
}

func (g *gen) deleteReq() *pb.DeleteRangeRequest {
	key := g.key()
	return &pb.DeleteRangeRequest{Key: key, RangeEnd: g.rangeEnd(key), PrevKv: g.chance(30)}
}

func (g *gen) deleteOp() *op {
	r := g.deleteReq()
	return noStream(&op{class: "delete", build: func(lidFunc) any { return r }})
}

func (g *gen) compactOp() *op {
	var rev int64
	switch n := g.r.IntN(6); n {
	case 0:
		rev = 0
	case 1:
		rev = g.rev
	case 2:
		rev = g.rev + 1
	case 3:
		rev = g.compacted // already compacted (or 0 before any)
	default:
		// Keep most of the history: compaction makes later reads fail.
		rev = g.compacted + g.r.Int64N(max(1, (g.rev-g.compacted)/4)+1)
	}
	r := &pb.CompactionRequest{Revision: rev, Physical: g.chance(50)}
	return noStream(&op{class: "compact", build: func(lidFunc) any { return r }})
}

// observe updates the model from the oracle's answer to o.
func (g *gen) observe(o *op, resp any, err error) {
	if err != nil {
		return
	}
	if h := header(resp); h != nil && h.Revision > g.rev {
		g.rev = h.Revision
	}
	switch r := resp.(type) {
	case *pb.CompactionResponse:
		if c := o.build(func(id int64) int64 { return id }).(*pb.CompactionRequest); c.Revision > g.compacted {
			g.compacted = c.Revision
		}
	case *pb.LeaseGrantResponse:
		if r.Error == "" {
			g.leases = append(g.leases, r.ID)
		}
	case *pb.LeaseRevokeResponse:
		id := o.build(func(id int64) int64 { return id }).(*pb.LeaseRevokeRequest).ID
		for i, l := range g.leases {
			if l == id {
				g.leases = append(g.leases[:i], g.leases[i+1:]...)
				g.revoked = append(g.revoked, id)
				break
			}
		}
	}
}

func header(resp any) *pb.ResponseHeader {
	if h, ok := resp.(interface{ GetHeader() *pb.ResponseHeader }); ok {
		return h.GetHeader()
	}
	return nil
}
