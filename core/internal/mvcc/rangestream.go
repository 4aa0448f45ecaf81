package mvcc

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// The reads behind etcd 3.7's KV.RangeStream. The stream (package etcdapi)
// reads a range chunk by chunk at one revision, so each call here reads
// only its chunk: memory stays bounded by the chunk, however large the
// range. etcd 3.7 serves each chunk with its ordinary range read minus the
// total count (server/etcdserver/txn/range.go, Range with withTotalCount
// false; server/storage/mvcc/kvstore_txn.go, rangeKeys), which these
// mirror.

// RangeChunk reads one chunk of a stream: req at req.Revision (0: the
// current revision), at most req.Limit keys (<= 0: all of them) in key
// order, then sorted as Range sorts. It reads one key past the limit to
// learn whether there are more, and never counts the rest of the range:
// Count is the number of keys read (at most Limit+1), as etcd's chunk read
// reports it, and the header carries the current revision.
//
// With KeysOnly and a sort target other than VALUE, the key-values carry no
// lease: etcd 3.7 answers such a read from its key index alone, which holds
// revisions and versions but not leases.
func (b *Backend) RangeChunk(ctx context.Context, req *pb.RangeRequest) (*pb.RangeResponse, error) {
	keep := -1
	if req.Limit > 0 && (plainOrder(req) || limitBeforeSort(req)) {
		keep = int(req.Limit) + 1
	}
	resp, err := b.answerRange(ctx, req, func(rev int64) ([]entry, int, error) {
		entries, err := b.pageAt(ctx, req.Key, req.RangeEnd, rev, keep)
		return entries, len(entries), err
	})
	if err != nil {
		return nil, err
	}
	if req.KeysOnly && req.SortTarget != pb.RangeRequest_VALUE {
		for _, kv := range resp.Kvs {
			kv.Lease = 0
		}
	}
	return resp, nil
}
