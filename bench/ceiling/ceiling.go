// Package ceiling is the benchmarks' upper bound: a gRPC server that answers
// the etcd KV, Watch and Maintenance.Status calls immediately, without
// storage. No store can answer faster on the same machine with the same load
// generator, so `make bench` reports every store's throughput as a fraction
// of this server's.
//
// It owns only canned answers of the right shape and size (a Range returns
// values of the benchmark's value size; list pages hold the requested number
// of keys; a write moves the revision by one). It must never store anything
// or grow per request, or it would stop being the machine's limit.
package ceiling

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
)

// Options shape the canned answers.
type Options struct {
	// ValueSize is the size of every value returned (default 512).
	ValueSize int
	// ListKeys is the number of keys a paginated range pretends to hold
	// (default 10000): a range with range_end answers pages of `limit` keys
	// until that many were returned, so a reflector-style list makes the
	// same number of round trips as against a store holding them.
	ListKeys int
}

// Server implements the etcd KV, Watch and Maintenance (Status only)
// services.
type Server struct {
	pb.UnimplementedKVServer
	pb.UnimplementedWatchServer
	pb.UnimplementedMaintenanceServer

	opts  Options
	value []byte
	rev   atomic.Int64
	// watchID numbers watches over all streams, as etcd does per stream;
	// uniqueness is all a client needs.
	watchID atomic.Int64
}

// New returns a ceiling server whose revision starts at 1, as a fresh etcd.
func New(opts Options) *Server {
	if opts.ValueSize <= 0 {
		opts.ValueSize = 512
	}
	if opts.ListKeys <= 0 {
		opts.ListKeys = 10_000
	}
	s := &Server{opts: opts, value: bytes.Repeat([]byte{'v'}, opts.ValueSize)}
	s.rev.Store(1)
	return s
}

// Register adds the services to gs.
func (s *Server) Register(gs *grpc.Server) {
	pb.RegisterKVServer(gs, s)
	pb.RegisterWatchServer(gs, s)
	pb.RegisterMaintenanceServer(gs, s)
}

func (s *Server) header(rev int64) *pb.ResponseHeader {
	return &pb.ResponseHeader{ClusterId: 1, MemberId: 1, Revision: rev, RaftTerm: 1}
}

// Range answers a point read with one canned key-value, a count-only read
// with ListKeys, and a range read with one page (see Options.ListKeys).
func (s *Server) Range(_ context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	rev := s.rev.Load()
	if r.Revision > 0 {
		rev = r.Revision
	}
	resp := &pb.RangeResponse{Header: s.header(rev)}
	switch {
	case r.CountOnly:
		resp.Count = int64(s.opts.ListKeys)
	case len(r.RangeEnd) == 0:
		resp.Kvs = []*mvccpb.KeyValue{s.kv(r.Key, rev)}
		resp.Count = 1
	default:
		s.page(r, rev, resp)
	}
	return resp, nil
}

// page fills one page of a paginated range without remembering anything
// between pages: the client continues at lastKey+"\x00", and the last key
// returned is the request key itself, so the number of trailing NUL bytes of
// the request key is the number of pages already served.
func (s *Server) page(r *pb.RangeRequest, rev int64, resp *pb.RangeResponse) {
	served := len(r.Key) - len(bytes.TrimRight(r.Key, "\x00"))
	limit := int(r.Limit)
	if limit <= 0 {
		limit = s.opts.ListKeys
	}
	left := max(s.opts.ListKeys-served*limit, 0)
	n := min(limit, left)
	resp.Count = int64(left)
	resp.More = left > n
	resp.Kvs = make([]*mvccpb.KeyValue, n)
	for i := range resp.Kvs {
		resp.Kvs[i] = s.kv(r.Key, rev)
	}
}

func (s *Server) kv(key []byte, rev int64) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: key, Value: s.value, CreateRevision: 1, ModRevision: rev, Version: 1}
}

// Put moves the revision.
func (s *Server) Put(_ context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	return &pb.PutResponse{Header: s.header(s.rev.Add(1))}, nil
}

// DeleteRange moves the revision and reports one key deleted.
func (s *Server) DeleteRange(_ context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	return &pb.DeleteRangeResponse{Header: s.header(s.rev.Add(1)), Deleted: 1}, nil
}

// Txn succeeds every compare and answers each success operation in shape;
// it moves the revision when the transaction writes.
func (s *Server) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	rev := s.rev.Load()
	for _, op := range r.Success {
		if op.GetRequestRange() == nil {
			rev = s.rev.Add(1)
			break
		}
	}
	resp := &pb.TxnResponse{Header: s.header(rev), Succeeded: true, Responses: make([]*pb.ResponseOp, 0, len(r.Success))}
	for _, op := range r.Success {
		switch req := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			rr, _ := s.Range(ctx, req.RequestRange)
			resp.Responses = append(resp.Responses, &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}})
		case *pb.RequestOp_RequestPut:
			resp.Responses = append(resp.Responses, &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{
				ResponsePut: &pb.PutResponse{Header: s.header(rev)}}})
		case *pb.RequestOp_RequestDeleteRange:
			resp.Responses = append(resp.Responses, &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{
				ResponseDeleteRange: &pb.DeleteRangeResponse{Header: s.header(rev), Deleted: 1}}})
		case *pb.RequestOp_RequestTxn:
			tr, _ := s.Txn(ctx, req.RequestTxn)
			resp.Responses = append(resp.Responses, &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: tr}})
		}
	}
	return resp, nil
}

// Compact accepts any revision.
func (s *Server) Compact(context.Context, *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	return &pb.CompactionResponse{Header: s.header(s.rev.Load())}, nil
}

// Watch acknowledges creates, cancels and progress requests and sends no
// events: with no storage there is nothing to deliver, so the watch workload
// has no ceiling figure.
func (s *Server) Watch(stream pb.Watch_WatchServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			// The client closed the stream (io.EOF) or went away.
			return nil
		}
		var resp *pb.WatchResponse
		switch r := req.RequestUnion.(type) {
		case *pb.WatchRequest_CreateRequest:
			id := r.CreateRequest.WatchId
			if id == 0 {
				id = s.watchID.Add(1)
			}
			resp = &pb.WatchResponse{Header: s.header(s.rev.Load()), WatchId: id, Created: true}
		case *pb.WatchRequest_CancelRequest:
			resp = &pb.WatchResponse{Header: s.header(s.rev.Load()), WatchId: r.CancelRequest.WatchId, Canceled: true}
		case *pb.WatchRequest_ProgressRequest:
			resp = &pb.WatchResponse{Header: s.header(s.rev.Load()), WatchId: -1}
		default:
			continue
		}
		if err := stream.Send(resp); err != nil {
			return fmt.Errorf("ceiling watch send: %w", err)
		}
	}
}

// Status reports the server as version "ceiling".
func (s *Server) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	rev := s.rev.Load()
	return &pb.StatusResponse{Header: s.header(rev), Version: "ceiling", Leader: 1, RaftIndex: uint64(rev), RaftTerm: 1}, nil
}
