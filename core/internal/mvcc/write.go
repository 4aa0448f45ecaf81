package mvcc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/retry"
	"github.com/engramkv/engram/core/kv"
)

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
	// lease grant/revoke
	leaseID  int64
	leaseTTL int64
	// tombstone cleanup: keys whose tombstones older than below may go.
	keys  [][]byte
	below int64
	// compaction writes
	ops []kv.Op

	done chan result
}

type result struct {
	txn *pb.TxnResponse
	rev int64
	err error
}

// size estimates the bytes a request adds to a batch: each written value is
// stored twice (history and change log reference) plus keys and headers.
func (r *request) size() int {
	if r.txn == nil {
		return 64
	}
	return 2 * r.txn.Size()
}

// exclusive requests are committed in a group of their own, so that the
// lessor state other requests in a group rely on cannot change under them.
func (r *request) exclusive() bool { return r.kind != reqTxn }

func (b *Backend) submit(ctx context.Context, r *request) (result, error) {
	if b.readOnly {
		return result{}, ErrNotLeader
	}
	if b.closed.Load() {
		return result{}, ErrClosed
	}
	r.ctx = ctx
	r.done = make(chan result, 1)
	select {
	case b.reqs <- r:
	case <-ctx.Done():
		return result{}, ctx.Err()
	case <-b.stopCh:
		return result{}, ErrClosed
	}
	select {
	case res := <-r.done:
		return res, res.err
	case <-ctx.Done():
		// The write may still commit, exactly as with etcd when a client
		// gives up on an in-flight request.
		return result{}, ctx.Err()
	}
}

// Txn executes an etcd transaction. A failed comparison is not an error:
// it yields Succeeded=false and the failure branch's responses.
func (b *Backend) Txn(ctx context.Context, txn *pb.TxnRequest) (*pb.TxnResponse, error) {
	res, err := b.submit(ctx, &request{kind: reqTxn, txn: txn})
	if err != nil {
		return nil, err
	}
	return res.txn, nil
}

// Put executes an etcd Put.
func (b *Backend) Put(ctx context.Context, req *pb.PutRequest) (*pb.PutResponse, error) {
	resp, err := b.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: req}}}})
	if err != nil {
		return nil, err
	}
	out := resp.Responses[0].GetResponsePut()
	out.Header = resp.Header
	return out, nil
}

// DeleteRange executes an etcd DeleteRange.
func (b *Backend) DeleteRange(ctx context.Context, req *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	resp, err := b.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: req}}}})
	if err != nil {
		return nil, err
	}
	out := resp.Responses[0].GetResponseDeleteRange()
	out.Header = resp.Header
	return out, nil
}

// commitCompaction commits compaction's engine writes through the writer,
// with the leader's fence: a deposed leader can neither move the compacted
// revision nor delete history the new leader serves.
func (b *Backend) commitCompaction(ctx context.Context, ops []kv.Op) error {
	if len(ops) == 0 {
		return nil
	}
	_, err := b.submit(ctx, &request{kind: reqCompaction, ops: ops})
	return err
}

// GrantLease durably creates lease id with ttl (already clamped by the
// caller) and returns the current revision.
func (b *Backend) GrantLease(ctx context.Context, id, ttl int64) (int64, error) {
	res, err := b.submit(ctx, &request{kind: reqLeaseGrant, leaseID: id, leaseTTL: ttl})
	return res.rev, err
}

// RevokeLease durably removes lease id and deletes its keys in one revision.
func (b *Backend) RevokeLease(ctx context.Context, id int64) (int64, error) {
	res, err := b.submit(ctx, &request{kind: reqLeaseRevoke, leaseID: id})
	return res.rev, err
}

// writeLoop is the single writer. It takes the queued requests, evaluates
// them in order against the latest state, and commits them in one batch.
func (b *Backend) writeLoop() {
	defer b.wg.Done()
	var pending *request
	for {
		first := pending
		pending = nil
		if first == nil {
			select {
			case first = <-b.reqs:
			case <-b.stopCh:
				b.drainOnStop()
				return
			}
		}
		group := []*request{first}
		if !first.exclusive() {
			size := first.size()
		collect:
			for len(group) < b.maxGroupRequests && size < b.maxGroupBytes {
				select {
				case r := <-b.reqs:
					if r.exclusive() {
						pending = r
						break collect
					}
					group = append(group, r)
					size += r.size()
				default:
					break collect
				}
			}
		}
		b.runGroup(group)
	}
}

// drainOnStop commits what was queued before Close so that no request that
// reached the writer is left without an answer.
func (b *Backend) drainOnStop() {
	for {
		select {
		case r := <-b.reqs:
			b.runGroup([]*request{r})
		default:
			return
		}
	}
}

func (b *Backend) runGroup(reqs []*request) {
	if b.metrics != nil {
		b.metrics.groupRequests.Observe(float64(len(reqs)))
	}
	g := newGroup(b)
	results := make([]result, len(reqs))
	live := make([]bool, len(reqs))
	for i, r := range reqs {
		if err := r.ctx.Err(); err != nil {
			results[i].err = err
			continue
		}
		live[i] = true
		var err error
		switch r.kind {
		case reqTxn:
			results[i].txn, err = g.txn(r.txn)
		case reqLeaseGrant:
			err = g.leaseGrant(r.leaseID, r.leaseTTL)
		case reqLeaseRevoke:
			err = g.leaseRevoke(r.leaseID)
		case reqCleanTombstones:
			err = g.cleanTombstones(r.keys, r.below)
		case reqCompaction:
			g.compaction = append(g.compaction, r.ops...)
		}
		if err != nil {
			if isStorageFailure(err) {
				// The group's view of the store is unreliable: fail it whole.
				for _, rr := range reqs {
					rr.done <- result{err: err}
				}
				return
			}
			results[i].err = err
			live[i] = false
		}
		results[i].rev = g.rev
	}
	if err := b.commitGroup(g); err != nil {
		if errors.Is(err, ErrTooLarge) && len(reqs) > 1 {
			// Nothing was written. Commit each request on its own, so
			// only the one that is too large fails.
			for _, r := range reqs {
				b.runGroup([]*request{r})
			}
			return
		}
		for i, r := range reqs {
			if live[i] {
				results[i] = result{err: err}
			}
			r.done <- results[i]
		}
		return
	}
	for i, r := range reqs {
		if live[i] && results[i].txn != nil {
			// Header.Revision of a write is its own revision; of a
			// read-only transaction, the revision it observed.
			results[i].txn.Header = &pb.ResponseHeader{Revision: results[i].rev}
			for _, op := range results[i].txn.Responses {
				setInnerHeader(op, results[i].rev)
			}
		}
		r.done <- results[i]
	}
}

// errAbortGroup fails every request of a group: its partial state must not
// be committed.
var errAbortGroup = errors.New("mvcc: write group aborted")

func isStorageFailure(err error) bool {
	return errors.Is(err, errAbortGroup) || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotLeader) || errors.Is(err, ErrClosed) || errors.Is(err, errBadRecord)
}

func setInnerHeader(op *pb.ResponseOp, rev int64) {
	h := &pb.ResponseHeader{Revision: rev}
	switch r := op.Response.(type) {
	case *pb.ResponseOp_ResponseRange:
		r.ResponseRange.Header = h
	case *pb.ResponseOp_ResponsePut:
		r.ResponsePut.Header = h
	case *pb.ResponseOp_ResponseDeleteRange:
		r.ResponseDeleteRange.Header = h
	case *pb.ResponseOp_ResponseTxn:
		r.ResponseTxn.Header = h
		for _, in := range r.ResponseTxn.Responses {
			setInnerHeader(in, rev)
		}
	}
}

// commitGroup writes the group's batch, resolves an uncertain outcome, and
// publishes the result: lessor updates, events, then the clock.
func (b *Backend) commitGroup(g *group) error {
	ops := g.batch()
	if len(ops) == 0 {
		return nil
	}
	var fenceKey []byte
	if b.fence != nil {
		op, err := b.fence()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrNotLeader, err)
		}
		fenceKey = op.Key
		ops = append(ops, op)
	}
	ctx := context.Background()
	if b.fence != nil && g.rev > g.baseRev {
		// Reads wait for this commit to settle (see readRevisions).
		inf := &inflightCommit{rev: g.rev, done: make(chan struct{})}
		b.inflight.Store(inf)
		defer func() {
			b.inflight.CompareAndSwap(inf, nil)
			close(inf.done)
		}()
	}
	start := time.Now()
	err := b.store.Commit(ctx, ops)
	if b.metrics != nil {
		b.metrics.commitSeconds.Observe(time.Since(start).Seconds())
	}
	switch {
	case errors.Is(err, kv.ErrUncertain) && len(g.compaction) > 0:
		// Compaction's writes are idempotent and take no revision:
		// nothing later depends on knowing whether they landed, so the
		// compactor just does them again.
	case errors.Is(err, kv.ErrUncertain):
		err = b.resolveUncertain(ctx, g, err)
	}
	b.updateLatest(g, err == nil)
	if err != nil {
		if c, ok := kv.AsConflict(err); ok && fenceKey != nil && bytes.Equal(c.Key, fenceKey) {
			return fmt.Errorf("%w: another node took over (fenced)", ErrNotLeader)
		}
		if c, ok := kv.AsConflict(err); ok {
			b.log.Error("store changed underneath the writer; write rejected", "key", fmt.Sprintf("%q", c.Key))
			return fmt.Errorf("%w: %w", ErrStoreConflict, err)
		}
		if errors.Is(err, kv.ErrBatchTooLarge) {
			return fmt.Errorf("%w (%d keys written in one revision): %w", ErrTooLarge, len(g.keys), err)
		}
		return storageErr("commit", err)
	}
	for _, fn := range g.after {
		fn()
	}
	if len(g.events) > 0 {
		if n := b.notifier.Load(); n != nil {
			n.n.Notify(g.rev, g.events)
		}
	}
	if g.rev > g.baseRev {
		b.clock.Advance(g.rev)
	}
	return nil
}

// updateLatest brings the latest-record cache in line with the group's
// batch before its revision is published: the new records when it
// committed, nothing cached for its keys when it did not (or may not have).
func (b *Backend) updateLatest(g *group, committed bool) {
	if b.latest == nil {
		return
	}
	for k, s := range g.keys {
		switch {
		case !s.dirty:
		case committed && !s.deleteRevKey:
			b.latest.set(k, s.record)
		default:
			b.latest.invalidate(k)
		}
	}
}

// resolveUncertain decides, before anything later commits, whether a batch
// whose commit result was unknown was applied (see package retry for why
// this order keeps revisions dense and watch order intact).
func (b *Backend) resolveUncertain(ctx context.Context, g *group, cause error) error {
	key, present := g.witness()
	b.log.Warn("commit result uncertain; reading back", "err", cause)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-b.stopCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := retry.Resolve(ctx, b.store, retry.Witness{Key: key, Value: g.witnessValue, Removed: !present}, retry.Options{Logger: b.log})
	if errors.Is(err, retry.ErrNotApplied) {
		return cause
	}
	return err
}

// keyState is a key's state as the writer sees it within a group.
type keyState struct {
	// base is the revision key's value in the store before this group (nil
	// when absent): the expected value of the group's compare-and-swap.
	base []byte
	// cur is the latest header including this group's writes; exists is
	// false when the revision key is absent (never written, or cleaned up).
	cur    header
	exists bool
	// value is cur's value (the revision key holds it).
	value []byte
	dirty bool
	// deleteRevKey removes the revision key instead of writing cur.
	deleteRevKey bool
	// record is what batch wrote to the revision key (nil when it deletes
	// it), for the latest-record cache once the batch committed.
	record []byte
}

func (s *keyState) live() bool { return s.exists && !s.cur.tombstone }

// group accumulates the writes of one commit.
type group struct {
	b       *Backend
	baseRev int64
	rev     int64
	keys    map[string]*keyState
	objects []kv.Op
	changes []change // of the transaction being executed
	logs    []kv.Op
	leases  map[string]kv.Op
	events  []*mvccpb.Event
	after   []func()

	witnessKey   []byte
	witnessValue []byte
	witnessGone  bool

	// compaction holds a compaction request's ops: they take no revision
	// and touch no revision key.
	compaction []kv.Op
}

func newGroup(b *Backend) *group {
	rev := b.clock.Current()
	return &group{b: b, baseRev: rev, rev: rev, keys: map[string]*keyState{}, leases: map[string]kv.Op{}}
}

// state loads a key's state, from this group or the store.
func (g *group) state(key []byte) (*keyState, error) {
	if s, ok := g.keys[string(key)]; ok {
		return s, nil
	}
	s := &keyState{}
	raw, err := g.b.latestRecord(context.Background(), key)
	switch {
	case errors.Is(err, kv.ErrNotFound):
	case err != nil:
		return nil, storageErr("get revision key", err)
	default:
		h, val, err := decodeHeader(raw)
		if err != nil {
			return nil, err
		}
		s.base, s.cur, s.exists, s.value = raw, h, true, val
	}
	g.keys[string(key)] = s
	return s, nil
}

// liveRange returns the live keys in [key, end) as of this group, sorted.
func (g *group) liveRange(key, end []byte) ([][]byte, error) {
	if len(end) == 0 {
		s, err := g.state(key)
		if err != nil {
			return nil, err
		}
		if s.live() {
			return [][]byte{key}, nil
		}
		return nil, nil
	}
	start, stop := coder.RevisionRange(key, end)
	seen := map[string]bool{}
	var out [][]byte
	err := scanAll(context.Background(), g.b.store, kv.ScanOptions{Start: start, End: stop, BatchSize: 1024}, func(p kv.Pair) error {
		k, err := coder.DecodeRevisionKey(p.Key)
		if err != nil {
			return err
		}
		seen[string(k)] = true
		if s, ok := g.keys[string(k)]; ok {
			if s.live() {
				out = append(out, k)
			}
			return nil
		}
		h, val, err := decodeHeader(p.Value)
		if err != nil {
			return err
		}
		if !h.tombstone {
			g.keys[string(k)] = &keyState{base: p.Value, cur: h, exists: true, value: val}
			out = append(out, k)
		}
		return nil
	})
	if err != nil {
		return nil, storageErr("scan", err)
	}
	// Keys this group created are not in the store yet.
	for k, s := range g.keys {
		if !seen[k] && s.live() && coder.InRange([]byte(k), key, end) {
			out = append(out, []byte(k))
		}
	}
	slices.SortFunc(out, bytes.Compare)
	return out, nil
}

// txn executes one transaction against the group's state.
func (g *group) txn(t *pb.TxnRequest) (*pb.TxnResponse, error) {
	path, err := g.comparePath(t)
	if err != nil {
		return nil, err
	}
	if err := g.check(t, path); err != nil {
		return nil, err
	}
	rev := g.rev + 1
	g.changes = g.changes[:0]
	resp, err := g.execTxn(t, path, rev)
	if err != nil {
		// check() ruled out every request error, so this is a storage
		// failure part-way through: the group's state is no longer
		// trustworthy.
		return nil, fmt.Errorf("%w: %w", errAbortGroup, err)
	}
	if len(g.changes) > 0 {
		g.rev = rev
		g.appendLog(rev)
	}
	return resp, nil
}

// appendLog adds the change-log record of rev. The group's first record is
// written with PutIfAbsent: a writer whose clock is stale (a second writer on
// the same store) then fails its whole batch instead of overwriting another
// writer's revision. One check per group is enough because every writer
// allocates revisions densely: whoever wrote any later revision of this
// group also wrote its first. The others are plain puts, which spares the
// engine a read per write.
func (g *group) appendLog(rev int64) {
	op := kv.Put(coder.EventKey(rev), encodeChanges(g.changes))
	if len(g.logs) == 0 {
		op.Kind = kv.OpPutIfAbsent
	}
	g.logs = append(g.logs, op)
	g.witnessKey, g.witnessValue, g.witnessGone = op.Key, op.Value, false
}

// comparePath evaluates every comparison of t and its nested transactions
// against the state before t, as etcd does, and records the branch taken at
// each level in depth-first order.
func (g *group) comparePath(t *pb.TxnRequest) ([]bool, error) {
	ok := true
	for _, c := range t.Compare {
		r, err := g.compare(c)
		if err != nil {
			return nil, err
		}
		if !r {
			ok = false
			break
		}
	}
	path := []bool{ok}
	for _, op := range branch(t, ok) {
		if nt := op.GetRequestTxn(); nt != nil {
			sub, err := g.comparePath(nt)
			if err != nil {
				return nil, err
			}
			path = append(path, sub...)
		}
	}
	return path, nil
}

func branch(t *pb.TxnRequest, ok bool) []*pb.RequestOp {
	if ok {
		return t.Success
	}
	return t.Failure
}

func (g *group) compare(c *pb.Compare) (bool, error) {
	keys, err := g.liveRange(c.Key, c.RangeEnd)
	if err != nil {
		return false, err
	}
	if len(keys) == 0 {
		if c.Target == pb.Compare_VALUE {
			// etcd: comparing the value of a missing key always fails.
			return false, nil
		}
		return compareHeader(c, header{}, nil), nil
	}
	for _, k := range keys {
		s := g.keys[string(k)]
		if !compareHeader(c, s.cur, s.value) {
			return false, nil
		}
	}
	return true, nil
}

func compareHeader(c *pb.Compare, h header, value []byte) bool {
	var r int
	switch c.Target {
	case pb.Compare_VALUE:
		r = bytes.Compare(value, c.GetValue())
	case pb.Compare_VERSION:
		r = cmpInt(h.version, c.GetVersion())
	case pb.Compare_CREATE:
		r = cmpInt(h.createRev, c.GetCreateRevision())
	case pb.Compare_MOD:
		r = cmpInt(h.modRev, c.GetModRevision())
	case pb.Compare_LEASE:
		r = cmpInt(h.lease, c.GetLease())
	}
	switch c.Result {
	case pb.Compare_EQUAL:
		return r == 0
	case pb.Compare_NOT_EQUAL:
		return r != 0
	case pb.Compare_GREATER:
		return r > 0
	case pb.Compare_LESS:
		return r < 0
	}
	return false
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// check validates the puts on t's path before anything executes, so a
// transaction either applies whole or fails without side effects.
func (g *group) check(t *pb.TxnRequest, path []bool) error {
	_, err := g.checkOps(t, path)
	return err
}

func (g *group) checkOps(t *pb.TxnRequest, path []bool) ([]bool, error) {
	ok, rest := path[0], path[1:]
	for _, op := range branch(t, ok) {
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestPut:
			p := r.RequestPut
			if p.Lease != 0 && !p.IgnoreLease && !g.b.lessor.Exists(p.Lease) {
				return nil, ErrLeaseNotFound
			}
			if p.IgnoreValue || p.IgnoreLease {
				s, err := g.state(p.Key)
				if err != nil {
					return nil, err
				}
				if !s.live() {
					return nil, ErrKeyNotFound
				}
			}
		case *pb.RequestOp_RequestRange:
			if rv := r.RequestRange.Revision; rv > 0 {
				if rv > g.rev {
					return nil, ErrFutureRev
				}
				if rv < g.b.compactRev.Load() {
					return nil, ErrCompacted
				}
			}
		case *pb.RequestOp_RequestTxn:
			var err error
			if rest, err = g.checkOps(r.RequestTxn, rest); err != nil {
				return nil, err
			}
		}
	}
	return rest, nil
}

func (g *group) execTxn(t *pb.TxnRequest, path []bool, rev int64) (*pb.TxnResponse, error) {
	resp, _, err := g.execPath(t, path, rev)
	return resp, err
}

func (g *group) execPath(t *pb.TxnRequest, path []bool, rev int64) (*pb.TxnResponse, []bool, error) {
	ok, rest := path[0], path[1:]
	ops := branch(t, ok)
	resp := &pb.TxnResponse{Succeeded: ok, Responses: make([]*pb.ResponseOp, 0, len(ops))}
	for _, op := range ops {
		var out *pb.ResponseOp
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			rr, err := g.rangeOp(r.RequestRange)
			if err != nil {
				return nil, nil, err
			}
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
		case *pb.RequestOp_RequestPut:
			pr, err := g.put(r.RequestPut, rev)
			if err != nil {
				return nil, nil, err
			}
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: pr}}
		case *pb.RequestOp_RequestDeleteRange:
			dr, err := g.deleteRange(r.RequestDeleteRange, rev)
			if err != nil {
				return nil, nil, err
			}
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: dr}}
		case *pb.RequestOp_RequestTxn:
			tr, r2, err := g.execPath(r.RequestTxn, rest, rev)
			if err != nil {
				return nil, nil, err
			}
			rest = r2
			out = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: tr}}
		default:
			return nil, nil, fmt.Errorf("mvcc: unknown request op %T", op.Request)
		}
		resp.Responses = append(resp.Responses, out)
	}
	return resp, rest, nil
}

// rangeOp serves a Range inside a write transaction: it sees the writes of
// earlier requests in the group and earlier ops of the same transaction. A
// revision, if given, must be the current one.
func (g *group) rangeOp(req *pb.RangeRequest) (*pb.RangeResponse, error) {
	if req.Revision > 0 && req.Revision != g.rev {
		if req.Revision > g.rev {
			return nil, ErrFutureRev
		}
		// A historical read inside a transaction reads committed history.
		unpin, err := g.b.pin(req.Revision)
		if err != nil {
			return nil, err
		}
		defer unpin()
		entries, count, err := g.b.entriesAt(context.Background(), req.Key, req.RangeEnd, req.Revision, -1)
		if err != nil {
			return nil, err
		}
		return buildRange(req, entries, count), nil
	}
	keys, err := g.liveRange(req.Key, req.RangeEnd)
	if err != nil {
		return nil, err
	}
	entries := make([]entry, len(keys))
	for i, k := range keys {
		s := g.keys[string(k)]
		entries[i] = entry{key: k, hdr: s.cur, value: s.value}
	}
	return buildRange(req, entries, len(entries)), nil
}

func (g *group) put(p *pb.PutRequest, rev int64) (*pb.PutResponse, error) {
	s, err := g.state(p.Key)
	if err != nil {
		return nil, err
	}
	resp := &pb.PutResponse{}
	wasLive := s.live()
	var prev *mvccpb.KeyValue
	if wasLive {
		prev = (&entry{key: p.Key, hdr: s.cur, value: s.value}).keyValue(true)
		if p.PrevKv {
			resp.PrevKv = prev
		}
	}
	value, leaseID := p.Value, p.Lease
	if p.IgnoreValue {
		value = s.value
	}
	if p.IgnoreLease {
		leaseID = s.cur.lease
	}
	h := header{modRev: rev, createRev: rev, version: 1, lease: leaseID}
	if wasLive {
		h.createRev, h.version = s.cur.createRev, s.cur.version+1
	}
	g.record(p.Key, s, h, value, prev)
	return resp, nil
}

func (g *group) deleteRange(d *pb.DeleteRangeRequest, rev int64) (*pb.DeleteRangeResponse, error) {
	keys, err := g.liveRange(d.Key, d.RangeEnd)
	if err != nil {
		return nil, err
	}
	resp := &pb.DeleteRangeResponse{Deleted: int64(len(keys))}
	for _, k := range keys {
		s := g.keys[string(k)]
		prev := (&entry{key: k, hdr: s.cur, value: s.value}).keyValue(true)
		if d.PrevKv {
			resp.PrevKvs = append(resp.PrevKvs, prev)
		}
		g.record(k, s, header{modRev: rev, tombstone: true}, nil, prev)
	}
	return resp, nil
}

// record applies one key's new version to the group: revision key, history,
// change log, lease index, watch event.
func (g *group) record(key []byte, s *keyState, h header, value []byte, prev *mvccpb.KeyValue) {
	oldLease := int64(0)
	if s.live() {
		oldLease = s.cur.lease
	}
	if s.exists {
		// The version being replaced (a tombstone too: reads between the
		// delete and this write must see the key deleted) moves to history.
		g.objects = append(g.objects, kv.Put(coder.ObjectKey(key, s.cur.modRev), encodeObject(s.cur, s.value)))
	}
	// etcd numbers the changes of a transaction from 0 in execution order.
	h.sub = int64(len(g.changes))
	s.cur, s.exists, s.dirty, s.value, s.deleteRevKey = h, true, true, value, false
	c := change{deleted: h.tombstone, key: key}
	if prev != nil {
		c.prevRev = prev.ModRevision
	}
	g.changes = append(g.changes, c)
	if oldLease != h.lease {
		k := append([]byte(nil), key...)
		if oldLease != 0 {
			ik := coder.LeaseIndexKey(oldLease, key)
			g.leases[string(ik)] = kv.Delete(ik)
			g.after = append(g.after, func() { g.b.lessor.Detach(oldLease, k) })
		}
		if h.lease != 0 {
			ik := coder.LeaseIndexKey(h.lease, key)
			g.leases[string(ik)] = kv.Put(ik, nil)
			newLease := h.lease
			g.after = append(g.after, func() { g.b.lessor.Attach(newLease, k) })
		}
	}
	ev := &mvccpb.Event{PrevKv: prev}
	if h.tombstone {
		ev.Type = mvccpb.DELETE
		ev.Kv = &mvccpb.KeyValue{Key: key, ModRevision: h.modRev}
	} else {
		ev.Type = mvccpb.PUT
		ev.Kv = (&entry{key: key, hdr: h, value: value}).keyValue(true)
	}
	g.events = append(g.events, ev)
}

func (g *group) leaseGrant(id, ttl int64) error {
	if g.b.lessor.Known(id) {
		return ErrLeaseExists
	}
	k := coder.LeaseKey(id)
	g.leases[string(k)] = kv.PutIfAbsent(k, encodeLease(ttl))
	g.witnessKey, g.witnessValue, g.witnessGone = k, encodeLease(ttl), false
	g.after = append(g.after, func() { g.b.lessor.Grant(id, ttl) })
	return nil
}

func (g *group) leaseRevoke(id int64) error {
	if !g.b.lessor.Known(id) {
		return ErrLeaseNotFound
	}
	rev := g.rev + 1
	g.changes = g.changes[:0]
	for _, k := range g.b.lessor.Keys(id) {
		s, err := g.state(k)
		if err != nil {
			return err
		}
		if !s.live() || s.cur.lease != id {
			continue
		}
		prev := (&entry{key: k, hdr: s.cur, value: s.value}).keyValue(true)
		g.record(k, s, header{modRev: rev, tombstone: true}, nil, prev)
	}
	lk := coder.LeaseKey(id)
	g.leases[string(lk)] = kv.Delete(lk)
	g.witnessKey, g.witnessGone = lk, true
	if len(g.changes) > 0 {
		g.rev = rev
		g.appendLog(rev)
	}
	g.after = append(g.after, func() { g.b.lessor.Revoke(id) })
	return nil
}

// cleanTombstones removes the revision keys of keys whose latest version is a
// tombstone older than below: compaction has made them unobservable.
func (g *group) cleanTombstones(keys [][]byte, below int64) error {
	for _, k := range keys {
		s, err := g.state(k)
		if err != nil {
			return err
		}
		if s.exists && s.cur.tombstone && s.cur.modRev < below && !s.dirty {
			s.exists, s.dirty, s.deleteRevKey = false, true, true
		}
	}
	return nil
}

// witness returns a key that only this group's batch writes (or removes), to
// read back after an uncertain commit.
func (g *group) witness() ([]byte, bool) {
	return g.witnessKey, !g.witnessGone
}

// batch assembles the group's atomic batch.
func (g *group) batch() []kv.Op {
	ops := make([]kv.Op, 0, len(g.keys)+len(g.objects)+len(g.logs)+len(g.leases))
	for k, s := range g.keys {
		if !s.dirty {
			continue
		}
		rk := coder.RevisionKey([]byte(k))
		switch {
		case s.deleteRevKey:
			ops = append(ops, kv.CompareAndDelete(rk, s.base))
		case s.base == nil:
			s.record = encodeObject(s.cur, s.value)
			ops = append(ops, kv.PutIfAbsent(rk, s.record))
		default:
			s.record = encodeObject(s.cur, s.value)
			ops = append(ops, kv.CompareAndSwap(rk, s.base, s.record))
		}
	}
	ops = append(ops, g.objects...)
	ops = append(ops, g.logs...)
	ops = append(ops, g.compaction...)
	for _, op := range g.leases {
		ops = append(ops, op)
	}
	if g.witnessKey == nil && len(ops) > 0 {
		// Only tombstone cleanup: the first revision key op witnesses it.
		g.witnessKey, g.witnessGone = ops[0].Key, ops[0].Kind == kv.OpCompareAndDelete
		g.witnessValue = ops[0].Value
	}
	return ops
}
