package etcdapi

import (
	"math"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// etcd 3.7's KV.RangeStream: one RangeRequest answered by a stream of
// partial RangeResponses, so a client (kube-apiserver's list) gets a large
// range without the server building one message for all of it. What etcd
// does, reproduced here (server/etcdserver/api/v3rpc/key.go,
// server/etcdserver/v3_server.go):
//
//   - The request is validated as a Range; a sort order other than none or
//     ascending by key, and any min/max revision filter, are refused with
//     Unimplemented. A sort target with order NONE is accepted: each chunk
//     is then sorted on its own, as a limited Range sorts.
//   - count_only is one message: the header and the range's count.
//   - Otherwise the first chunk reads at most 10 keys (fewer when the
//     request's limit is smaller). Its header revision, the current one,
//     becomes the stream's, and the read revision when the request named
//     none: every later chunk reads at that revision, whatever is written
//     meanwhile. Each next chunk starts just after the last key sent, and
//     its size doubles while a chunk's encoded size is under half the
//     request size limit and halves when over twice it.
//   - Only the last chunk has a header (the pinned revision), More and
//     Count; Count adds the keys left in the range after a limit.
//   - A negative limit reads everything in the first chunk.
//
// There is no request size check beyond the transport's: etcd bounds only
// what it proposes to raft, and a read is never proposed.

// streamFirstChunk is the number of keys etcd's first chunk reads.
const streamFirstChunk = 10

func (k *kvServer) RangeStream(r *pb.RangeRequest, stream grpc.ServerStreamingServer[pb.RangeStreamResponse]) error {
	if err := k.s.limits.checkRange(r); err != nil {
		return err
	}
	if err := k.s.authorize(stream.Context(), needRange(r)); err != nil {
		return err
	}
	if r.SortOrder != pb.RangeRequest_NONE && (r.SortTarget != pb.RangeRequest_KEY || r.SortOrder != pb.RangeRequest_ASCEND) {
		return status.Error(codes.Unimplemented, "RangeStream does not support custom sort orders")
	}
	if r.MinModRevision != 0 || r.MaxModRevision != 0 || r.MinCreateRevision != 0 || r.MaxCreateRevision != 0 {
		return status.Error(codes.Unimplemented, "RangeStream does not support revision filters")
	}
	if err := k.rangeStream(proto.Clone(r).(*pb.RangeRequest), stream); err != nil {
		return toGRPC(err)
	}
	return nil
}

// rangeStream sends the chunks of r, which it changes as it goes (key,
// limit, revision).
func (k *kvServer) rangeStream(r *pb.RangeRequest, stream grpc.ServerStreamingServer[pb.RangeStreamResponse]) error {
	ctx := stream.Context()
	if r.CountOnly {
		resp, err := k.s.current().Backend.Range(ctx, r)
		if err != nil {
			return err
		}
		return stream.Send(&pb.RangeStreamResponse{RangeResponse: &pb.RangeResponse{Header: k.s.header(resp.Header.Revision), Count: resp.Count}})
	}
	total := r.Limit
	if total == 0 {
		total = math.MaxInt64
	}
	r.Limit = min(streamFirstChunk, total)
	var sent, headerRev int64
	for {
		resp, err := k.s.current().Backend.RangeChunk(ctx, r)
		if err != nil {
			return err
		}
		if headerRev == 0 {
			headerRev = resp.Header.Revision
			if r.Revision == 0 {
				r.Revision = headerRev
			}
		}
		sent += int64(len(resp.Kvs))
		out := &pb.RangeResponse{Kvs: resp.Kvs}
		done := !resp.More || sent == total
		var next []byte
		if resp.More {
			next = append(append([]byte(nil), resp.Kvs[len(resp.Kvs)-1].Key...), 0)
		}
		if done {
			out.Header, out.More, out.Count = k.s.header(headerRev), resp.More, sent
			if resp.More {
				rest, err := k.s.current().Backend.Range(ctx, &pb.RangeRequest{Key: next, RangeEnd: r.RangeEnd, Revision: r.Revision, CountOnly: true})
				if err != nil {
					return err
				}
				out.Count += rest.Count
			}
		}
		if err := stream.Send(&pb.RangeStreamResponse{RangeResponse: out}); err != nil {
			return err
		}
		if done {
			return nil
		}
		r.Key = next
		r.Limit = min(nextChunkLimit(r.Limit, proto.Size(resp), k.s.limits.MaxRequestBytes), total-sent)
	}
}

// nextChunkLimit sizes the next chunk from the last one as etcd does: twice
// as many keys when the last chunk encoded to under half of target bytes,
// half as many when over twice target, else the same; never fewer than one
// (a limit of 0 would mean all).
func nextChunkLimit(last int64, size, target int) int64 {
	switch {
	case size < target/2:
		last *= 2
	case size > target*2:
		last /= 2
	}
	return max(last, 1)
}
