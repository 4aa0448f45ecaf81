package mvcc

import (
	"context"
	"errors"
	"runtime/pprof"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"

	"github.com/engramkv/engram/core/kv"
)

// The writer loop: every write (a transaction, a lease grant or revoke,
// compaction's deletes) becomes a request queued to the single writer,
// which evaluates the requests in arrival order (txn.go) into a group and
// hands the group to the committer (pipeline.go) as soon as the committer
// is free; meanwhile it goes on evaluating the next group on top of the
// previous one. One writer is what makes revisions dense and every check of
// a compare or CAS exact. Why writes are grouped and pipelined: (DESIGN.md,
// "Group commit", "Pipelined group commit").

type requestKind uint8

const (
	reqTxn requestKind = iota
	reqLeaseGrant
	reqLeaseRevoke
	reqCleanTombstones
	// reqCompaction carries compaction's own engine writes (the compacted
	// revision record, history and change-log deletes), so they carry the
	// leader's fence like every other write.
	reqCompaction
)

// request is one write waiting for the writer.
type request struct {
	ctx  context.Context
	kind requestKind
	txn  *pb.TxnRequest
	// single marks a Put or DeleteRange request sent as a transaction.
	single bool
	// lease grant/revoke
	leaseID  int64
	leaseTTL int64
	// tombstone cleanup: keys whose tombstones older than below may go.
	keys  [][]byte
	below int64
	// compaction writes
	ops []kv.Op

	// prefetch holds the records read before queuing (prefetch.go): reads,
	// kept in the request to spare an allocation, or nil.
	prefetch *prefetch
	reads    prefetch
	// readsPast: a Range inside the transaction reads an explicit
	// revision, which only a quiet group can serve (txnrange.go).
	readsPast bool
	// solo: evaluate in a group of its own (its group was too large).
	solo bool
	// txnSize is size() of a transaction.
	txnSize int

	// done carries one value when res is set: a channel of struct{} is
	// one allocation, a buffered channel of result two.
	done chan struct{}
	res  result
}

type result struct {
	txn *pb.TxnResponse
	rev int64
	err error
	// hdr is the transaction's own header, allocated with its response.
	hdr *pb.ResponseHeader
}

// size estimates the bytes a request adds to a batch: each written value is
// stored twice (history and change log reference) plus keys and headers.
// The request's own goroutine computes it (txnRequest): it walks the whole
// request, which the writer should not spend its time on.
func (r *request) size() int {
	if r.txn == nil {
		return 64
	}
	return r.txnSize
}

// exclusive requests are evaluated with nothing in the pipeline and
// committed in a group of their own before anything after them is
// evaluated, so that the lessor state other requests rely on (updated
// when a group is published) cannot change under them.
func (r *request) exclusive() bool { return r.kind != reqTxn || r.solo }

func (b *Backend) submit(ctx context.Context, r *request) (result, error) {
	if b.readOnly {
		return result{}, ErrNotLeader
	}
	if b.closed.Load() {
		return result{}, ErrClosed
	}
	r.ctx = ctx
	r.done = make(chan struct{}, 1)
	select {
	case b.reqs <- r:
	case <-ctx.Done():
		return result{}, ctx.Err()
	case <-b.stopCh:
		return result{}, ErrClosed
	}
	select {
	case <-r.done:
		return r.res, r.res.err
	case <-ctx.Done():
		// The write may still commit, exactly as with etcd when a client
		// gives up on an in-flight request.
		return result{}, ctx.Err()
	}
}

// Txn executes an etcd transaction. A failed comparison is not an error:
// it yields Succeeded=false and the failure branch's responses.
func (b *Backend) Txn(ctx context.Context, txn *pb.TxnRequest) (*pb.TxnResponse, error) {
	res, err := b.submit(ctx, b.txnRequest(ctx, txn, false))
	if err != nil {
		return nil, err
	}
	return res.txn, nil
}

// Put executes an etcd Put.
func (b *Backend) Put(ctx context.Context, req *pb.PutRequest) (*pb.PutResponse, error) {
	w := new(oneOpTxn)
	w.put.RequestPut = req
	op, err := b.single(ctx, w)
	return op.GetResponsePut(), err
}

// DeleteRange executes an etcd DeleteRange.
func (b *Backend) DeleteRange(ctx context.Context, req *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	w := new(oneOpTxn)
	w.del.RequestDeleteRange = req
	op, err := b.single(ctx, w)
	return op.GetResponseDeleteRange(), err
}

// oneOpTxn wraps one Put or DeleteRange as the transaction the writer
// executes. The wrapping is four small objects; allocated together they
// cost a Put one allocation instead of four (BenchmarkRequests).
type oneOpTxn struct {
	txn pb.TxnRequest
	ops [1]*pb.RequestOp
	op  pb.RequestOp
	put pb.RequestOp_RequestPut
	del pb.RequestOp_RequestDeleteRange
}

// single executes w's op, its put if set, else its delete, as a
// transaction of one op, and returns that op's answer (nil on an error)
// with the transaction's header as its own.
func (b *Backend) single(ctx context.Context, w *oneOpTxn) (*pb.ResponseOp, error) {
	if w.put.RequestPut != nil {
		w.op.Request = &w.put
	} else {
		w.op.Request = &w.del
	}
	w.ops[0] = &w.op
	w.txn.Success = w.ops[:]
	res, err := b.submit(ctx, b.txnRequest(ctx, &w.txn, true))
	if err != nil {
		return nil, err
	}
	op := res.txn.Responses[0]
	switch r := op.Response.(type) {
	case *pb.ResponseOp_ResponsePut:
		r.ResponsePut.Header = res.txn.Header
	case *pb.ResponseOp_ResponseDeleteRange:
		r.ResponseDeleteRange.Header = res.txn.Header
	}
	return op, nil
}

// txnRequest builds the writer's request for t, with the records it will
// need read ahead (prefetch.go).
func (b *Backend) txnRequest(ctx context.Context, t *pb.TxnRequest, single bool) *request {
	r := &request{kind: reqTxn, txn: t, single: single, readsPast: readsPast(t), txnSize: 2 * proto.Size(t)}
	if !b.readOnly {
		var buf [2][]byte
		keys, ranges := txnReads(t, buf[:0], nil)
		r.prefetch = b.readAhead(ctx, &r.reads, keys, ranges, presumable(t))
	}
	return r
}

// readsPast reports whether a Range anywhere in t (either branch, nested
// transactions too) reads an explicit revision.
func readsPast(t *pb.TxnRequest) bool {
	for _, ops := range [2][]*pb.RequestOp{t.Success, t.Failure} {
		for _, op := range ops {
			switch r := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
				if r.RequestRange.Revision > 0 {
					return true
				}
			case *pb.RequestOp_RequestTxn:
				if readsPast(r.RequestTxn) {
					return true
				}
			}
		}
	}
	return false
}

// writeLoop is the single writer. It evaluates each request as it arrives
// into the open group and hands the group over when the committer is free
// (or the group is full), so that a group holds everything that arrived
// while the previous one was committing.
func (w *writer) writeLoop() {
	b := w.b
	defer b.wg.Done()
	// A CPU profile tells the writer's samples by this label
	// (go tool pprof -tagfocus=engram=writer).
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("engram", "writer")))
	var g *group
	for {
		w.prune()
		if w.p.isBroken() {
			w.recover(g)
			g = nil
			continue
		}
		if g != nil && g.full() {
			w.push(g)
			g = nil
			continue
		}
		if g != nil && w.p.idle() {
			// The committer is free: hand the group over, after what is
			// already queued (a group per request would cost a commit
			// per request).
			select {
			case r := <-b.reqs:
				g = w.take(g, r)
			default:
				w.push(g)
				g = nil
			}
			continue
		}
		var r *request
		if len(w.again) > 0 {
			r = w.again[0]
			w.again[0] = nil
			w.again = w.again[1:]
		} else {
			select {
			case r = <-b.reqs:
			case <-w.p.room:
				// The committer finished a group: it may be free for
				// the open one, or the group failed and the pipeline
				// must be mended before anything else commits.
				continue
			case <-b.stopCh:
				w.stop(g)
				return
			}
		}
		g = w.take(g, r)
	}
}

// take evaluates r into the open group g (opening one if needed) and
// returns the open group afterwards (nil when r closed it).
func (w *writer) take(g *group, r *request) *group {
	w.prune()
	switch {
	case r.exclusive():
		if g != nil {
			w.push(g)
		}
		if !w.p.drain() {
			w.again = append([]*request{r}, w.again...)
			return nil
		}
		g = w.open()
		w.eval(g, r)
		if len(g.reqs) > 0 {
			w.push(g)
			w.p.drain()
		}
		return nil
	case r.readsPast && (g == nil || !g.quiet):
		if g != nil {
			w.push(g)
		}
		if !w.p.drain() {
			w.again = append([]*request{r}, w.again...)
			return nil
		}
		g = nil
	}
	if g == nil {
		g = w.open()
	}
	w.eval(g, r)
	if len(g.reqs) == 0 {
		return nil // the group failed whole
	}
	return g
}

// eval evaluates one request into g. A storage failure part-way leaves g's
// view of the store unreliable: every request of g fails and g is dropped
// (emptied).
func (w *writer) eval(g *group, r *request) {
	start := time.Now()
	defer func() { g.evalNanos += int64(time.Since(start)) }()
	i := len(g.reqs)
	g.reqs = append(g.reqs, r)
	g.results = append(g.results, result{})
	g.live = append(g.live, false)
	g.size += r.size()
	if err := r.ctx.Err(); err != nil {
		g.results[i].err = err
		return
	}
	g.live[i] = true
	g.cur = r
	var err error
	switch r.kind {
	case reqTxn:
		var out *txnOut
		if out, err = g.txn(r.txn, r.single); out != nil {
			g.results[i].txn, g.results[i].hdr = &out.resp, &out.hdr
		}
	case reqLeaseGrant:
		err = g.leaseGrant(r.leaseID, r.leaseTTL)
	case reqLeaseRevoke:
		err = g.leaseRevoke(r.leaseID)
	case reqCleanTombstones:
		err = g.cleanTombstones(r.keys, r.below)
	case reqCompaction:
		g.compaction = append(g.compaction, r.ops...)
	}
	g.cur = nil
	if err != nil {
		if isStorageFailure(err) {
			g.fail(err)
			*g = group{b: g.b, w: g.w}
			return
		}
		g.results[i].err = err
		g.live[i] = false
	}
	g.results[i].rev = g.rev
}

// push hands g to the committer. A group refused because the pipeline broke
// was built on a failed group: recover sends its requests round again.
func (w *writer) push(g *group) {
	w.finish(g)
	w.b.writerBusy.Add(g.evalNanos)
	if w.b.metrics != nil {
		w.b.metrics.observeGroup(g, w.p.inFlight()+1)
	}
	if !w.p.push(g) {
		w.recover(g)
	}
}

// recover mends the pipeline after a failed group: the requests of the
// groups thrown away (and of g, the open or refused group, if any) are
// evaluated again, in order, against the committed state.
func (w *writer) recover(g *group) {
	reqs := w.p.takeReturned()
	if g != nil {
		reqs = append(reqs, g.reqs...)
	}
	if w.b.metrics != nil {
		w.b.metrics.requeued.Add(float64(len(reqs)))
	}
	w.again = append(reqs, w.again...)
	w.reset()
}

// stop commits what was queued before Close, so that no request that
// reached the writer is left without an answer, then stops the committer.
func (w *writer) stop(g *group) {
	for {
		if w.p.isBroken() {
			w.recover(g)
			g = nil
		}
		var r *request
		if len(w.again) > 0 {
			r = w.again[0]
			w.again = w.again[1:]
		} else {
			select {
			case r = <-w.b.reqs:
			default:
			}
		}
		if r == nil {
			if g != nil {
				w.push(g)
				g = nil
				continue // it may have been refused
			}
			if w.p.drain() {
				w.p.close()
				return
			}
			continue
		}
		g = w.take(g, r)
		if g != nil && g.full() {
			w.push(g)
			g = nil
		}
	}
}

// full reports whether the group reached its request or size bound.
func (g *group) full() bool {
	return len(g.reqs) >= g.b.maxGroupRequests || g.size >= g.b.maxGroupBytes
}

// answer sends every request of a committed group its result.
func (g *group) answer() {
	for i, r := range g.reqs {
		if g.live[i] && g.results[i].txn != nil {
			// Header.Revision of a write is its own revision; of a
			// read-only transaction, the revision it observed. The ops'
			// headers inside were set as they executed (execPath).
			h := g.results[i].hdr
			h.Revision = g.results[i].rev
			g.results[i].txn.Header = h
		}
		r.answer(g.results[i])
	}
}

// answer gives r its result; exactly once, from the committer.
func (r *request) answer(res result) {
	r.res = res
	r.done <- struct{}{}
}

// fail answers every request of a group that could not be committed: the
// ones still live get err, the others keep their own error.
func (g *group) fail(err error) {
	for i, r := range g.reqs {
		if g.live[i] || g.results[i].err == nil {
			g.results[i] = result{err: err}
		}
		r.answer(g.results[i])
	}
}

// errAbortGroup fails every request of a group: its partial state must not
// be committed.
var errAbortGroup = errors.New("mvcc: write group aborted")

func isStorageFailure(err error) bool {
	return errors.Is(err, errAbortGroup) || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotLeader) || errors.Is(err, ErrClosed) || errors.Is(err, errBadRecord)
}
