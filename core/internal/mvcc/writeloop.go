package mvcc

import (
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"

	"github.com/engramkv/engram/core/kv"
)

// The writer loop: every write (a transaction, a lease grant or revoke,
// compaction's deletes) becomes a request queued to the single writer, which
// collects the queued requests into a group, evaluates them in order
// (txn.go), commits the group in one batch (groupcommit.go) and answers each
// request. One writer is what makes revisions dense and every check of a
// compare or CAS exact. Why writes are grouped: (DESIGN.md, "Group commit").

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
	return 2 * proto.Size(r.txn)
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
	resp, err := b.single(ctx, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: req}})
	if err != nil {
		return nil, err
	}
	out := resp.Responses[0].GetResponsePut()
	out.Header = resp.Header
	return out, nil
}

// DeleteRange executes an etcd DeleteRange.
func (b *Backend) DeleteRange(ctx context.Context, req *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	resp, err := b.single(ctx, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: req}})
	if err != nil {
		return nil, err
	}
	out := resp.Responses[0].GetResponseDeleteRange()
	out.Header = resp.Header
	return out, nil
}

// single executes one Put or DeleteRange request as a transaction of one op.
func (b *Backend) single(ctx context.Context, op *pb.RequestOp) (*pb.TxnResponse, error) {
	res, err := b.submit(ctx, &request{kind: reqTxn, single: true, txn: &pb.TxnRequest{Success: []*pb.RequestOp{op}}})
	if err != nil {
		return nil, err
	}
	return res.txn, nil
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
			results[i].txn, err = g.txn(r.txn, r.single)
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
			// read-only transaction, the revision it observed. The ops'
			// headers inside were set as they executed (execPath).
			results[i].txn.Header = &pb.ResponseHeader{Revision: results[i].rev}
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
