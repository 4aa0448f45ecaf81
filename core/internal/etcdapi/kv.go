package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/internal/auth"
)

type kvServer struct {
	pb.UnimplementedKVServer
	s *Services
}

// admitWrite runs the checks etcd makes of a Put or Txn before serving or
// forwarding it, in etcd's order: the quota first (on the leader, which
// alone knows the store's size), then the request's own limits (invalid,
// the error limits found), then auth.
func (s *Services) admitWrite(ctx context.Context, role *Role, r any, invalid error, need func(auth.Checker, *auth.Info) error) error {
	if role.leading() {
		if err := s.admitQuota(ctx, role, r); err != nil {
			return err
		}
	}
	if invalid != nil {
		return invalid
	}
	return s.authorize(ctx, need)
}

func (k *kvServer) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	if err := k.s.limits.checkSize(r); err != nil {
		return nil, err
	}
	if err := k.s.limits.checkRange(r); err != nil {
		return nil, err
	}
	if err := k.s.authorize(ctx, needRange(r)); err != nil {
		return nil, err
	}
	// A leader whose lease lapsed refuses reads until the next role
	// serves them (reroute.go).
	return serveWithRole(ctx, k.s, false, func(role *Role) (*pb.RangeResponse, error) {
		resp, err := role.Backend.Range(ctx, r)
		if err != nil {
			return nil, fromBackend(err)
		}
		k.s.fillHeader(&resp.Header, 0)
		return resp, nil
	})
}

func (k *kvServer) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := k.s.limits.checkSize(r); err != nil {
		return nil, err
	}
	return serveWithRole(ctx, k.s, true, func(role *Role) (*pb.PutResponse, error) {
		if err := k.s.admitWrite(ctx, role, r, k.s.limits.checkPut(r), needPut(r, role.leaseKeys())); err != nil {
			return nil, err
		}
		if !role.leading() {
			return forward(ctx, role, pb.NewKVClient, pb.KVClient.Put, r)
		}
		resp, err := role.Backend.Put(ctx, r)
		if err != nil {
			return nil, fromBackend(err)
		}
		k.s.fillHeader(&resp.Header, 0)
		return resp, nil
	})
}

func (k *kvServer) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	if err := k.s.limits.checkSize(r); err != nil {
		return nil, err
	}
	if err := k.s.limits.checkDelete(r); err != nil {
		return nil, err
	}
	if err := k.s.authorize(ctx, needDelete(r)); err != nil {
		return nil, err
	}
	return serveWithRole(ctx, k.s, true, func(role *Role) (*pb.DeleteRangeResponse, error) {
		if !role.leading() {
			return forward(ctx, role, pb.NewKVClient, pb.KVClient.DeleteRange, r)
		}
		resp, err := role.Backend.DeleteRange(ctx, r)
		if err != nil {
			return nil, fromBackend(err)
		}
		k.s.fillHeader(&resp.Header, 0)
		return resp, nil
	})
}

func (k *kvServer) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := k.s.limits.checkSize(r); err != nil {
		return nil, err
	}
	return serveWithRole(ctx, k.s, true, func(role *Role) (*pb.TxnResponse, error) {
		if err := k.s.admitWrite(ctx, role, r, k.s.limits.checkTxn(r), needTxn(r, role.leaseKeys())); err != nil {
			return nil, err
		}
		if !role.leading() {
			return forward(ctx, role, pb.NewKVClient, pb.KVClient.Txn, r)
		}
		resp, err := role.Backend.Txn(ctx, r)
		if err != nil {
			return nil, fromBackend(err)
		}
		k.s.fillTxnHeaders(resp)
		return resp, nil
	})
}

// fillTxnHeaders completes the transaction's own header only: etcd leaves
// the headers of the responses inside a transaction as its store set them
// (a revision, no cluster or member ID) and a nested transaction's empty.
func (s *Services) fillTxnHeaders(resp *pb.TxnResponse) {
	s.fillHeader(&resp.Header, 0)
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
