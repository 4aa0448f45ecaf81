package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/engramkv/engram/core/internal/auth"
	"github.com/engramkv/engram/core/internal/mvcc"
)

type kvServer struct {
	pb.UnimplementedKVServer
	s *Services
}

func (k *kvServer) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	if err := admit(ctx, k.s, r, Limits.checkRange, needRange(r)); err != nil {
		return nil, err
	}
	// A leader whose lease lapsed refuses reads until the next role
	// serves them (reroute.go).
	return serveWithRole(ctx, k.s, false, func(role *Role) (*pb.RangeResponse, error) {
		resp, err := role.Backend.Range(ctx, r)
		return answered(k.s, resp, err, func(resp *pb.RangeResponse) **pb.ResponseHeader { return &resp.Header })
	})
}

// admit makes the checks etcd makes of a Range or a DeleteRange before it
// is served, in etcd's order: the request's size, its own limits, the
// caller's permission.
func admit[Req proto.Message](ctx context.Context, s *Services, r Req, limits func(Limits, Req) error, need func(auth.Checker, *auth.Info) error) error {
	if err := s.limits.checkSize(r); err != nil {
		return err
	}
	if err := limits(s.limits, r); err != nil {
		return err
	}
	return s.authorize(ctx, need)
}

// answered completes what the backend answered: its error as etcd answers
// it, else the answer with its top-level header (header) completed.
func answered[Resp any](s *Services, resp Resp, err error, header func(Resp) **pb.ResponseHeader) (Resp, error) {
	if err != nil {
		var none Resp
		return none, fromBackend(err)
	}
	s.fillHeader(header(resp), 0)
	return resp, nil
}

func (k *kvServer) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	return serveWrite(ctx, k.s, r, write[*pb.PutRequest, *pb.PutResponse]{
		limits:  Limits.checkPut,
		permits: permitsPut,
		forward: pb.KVClient.Put,
		apply:   (*mvcc.Backend).Put,
		header:  func(resp *pb.PutResponse) **pb.ResponseHeader { return &resp.Header },
	})
}

// write is what tells a Put from a Txn on their way in; everything else
// about serving them is serveWrite's one sequence.
type write[Req proto.Message, Resp any] struct {
	// limits checks the request's own limits (keys, ops, leases named).
	limits func(Limits, Req) error
	// permits checks that the caller may make the request, with the
	// leases of the role it runs under.
	permits func(auth.Checker, *auth.Info, *Role, Req) error
	// forward is the leader's method a follower sends the request to.
	forward func(pb.KVClient, context.Context, Req, ...grpc.CallOption) (Resp, error)
	// apply is the backend's method the leader serves it with.
	apply func(*mvcc.Backend, context.Context, Req) (Resp, error)
	// header is the response's top-level header, which fillHeader
	// completes.
	header func(Resp) **pb.ResponseHeader
}

// serveWrite serves a Put or a Txn with the checks etcd makes of them, in
// etcd's order, so that a request wrong in several ways gets etcd's answer:
// the request's size; then, under the node's role, the quota (on the
// leader, which alone knows the store's size, so an over-quota write gets
// etcd's no-space answer whatever else is wrong with it), the request's
// own limits, and auth. A follower forwards what passed them to the leader,
// so a refused write never leaves it; the leader applies it. The
// differential tests against etcd (core/server's Diff tests and
// tests/etcddiff) pin this order.
func serveWrite[Req proto.Message, Resp any](ctx context.Context, s *Services, r Req, w write[Req, Resp]) (Resp, error) {
	var none Resp
	if err := s.limits.checkSize(r); err != nil {
		return none, err
	}
	return serveWithRole(ctx, s, true, func(role *Role) (Resp, error) {
		if role.leading() {
			if err := s.admitQuota(ctx, role, r); err != nil {
				return none, err
			}
		}
		if err := w.limits(s.limits, r); err != nil {
			return none, err
		}
		if err := s.authorize(ctx, func(c auth.Checker, ai *auth.Info) error { return w.permits(c, ai, role, r) }); err != nil {
			return none, err
		}
		if !role.leading() {
			return forward(ctx, role, pb.NewKVClient, w.forward, r)
		}
		resp, err := w.apply(role.Backend, ctx, r)
		return answered(s, resp, err, w.header)
	})
}

func (k *kvServer) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	if err := admit(ctx, k.s, r, Limits.checkDelete, needDelete(r)); err != nil {
		return nil, err
	}
	return serveWithRole(ctx, k.s, true, func(role *Role) (*pb.DeleteRangeResponse, error) {
		if !role.leading() {
			return forward(ctx, role, pb.NewKVClient, pb.KVClient.DeleteRange, r)
		}
		resp, err := role.Backend.DeleteRange(ctx, r)
		return answered(k.s, resp, err, func(resp *pb.DeleteRangeResponse) **pb.ResponseHeader { return &resp.Header })
	})
}

func (k *kvServer) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	return serveWrite(ctx, k.s, r, write[*pb.TxnRequest, *pb.TxnResponse]{
		limits:  Limits.checkTxn,
		permits: permitsTxn,
		forward: pb.KVClient.Txn,
		apply:   (*mvcc.Backend).Txn,
		// Only the transaction's own header: etcd leaves the headers of
		// the responses inside it as its store set them (a revision, no
		// cluster or member ID) and a nested transaction's empty.
		header: func(resp *pb.TxnResponse) **pb.ResponseHeader { return &resp.Header },
	})
}

func (k *kvServer) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	if err := k.s.authorizeAdmin(ctx); err != nil {
		return nil, err
	}
	return serveWithRole(ctx, k.s, true, func(role *Role) (*pb.CompactionResponse, error) {
		if !role.leading() {
			return forward(ctx, role, pb.NewKVClient, pb.KVClient.Compact, r)
		}
		rev, err := role.Backend.Compact(ctx, r.Revision, r.Physical)
		if err != nil {
			return nil, fromBackend(err)
		}
		return &pb.CompactionResponse{Header: k.s.header(rev)}, nil
	})
}
