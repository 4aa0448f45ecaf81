package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

type kvServer struct {
	pb.UnimplementedKVServer
	s *Services
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
	resp, err := k.s.current().Backend.Range(ctx, r)
	if err != nil {
		return nil, toGRPC(err)
	}
	k.s.fillHeader(&resp.Header, 0)
	return resp, nil
}

func (k *kvServer) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := k.s.limits.checkSize(r); err != nil {
		return nil, err
	}
	role := k.s.current()
	if role.leading() {
		// etcd checks the quota first, before validation and auth.
		if err := k.s.admitWrite(ctx, role, r); err != nil {
			return nil, err
		}
	}
	if err := k.s.limits.checkPut(r); err != nil {
		return nil, err
	}
	if err := k.s.authorize(ctx, needPut(r, role.leaseKeys())); err != nil {
		return nil, err
	}
	if !role.leading() {
		return forward(ctx, role, pb.NewKVClient, pb.KVClient.Put, r)
	}
	resp, err := role.Backend.Put(ctx, r)
	if err != nil {
		return nil, toGRPC(err)
	}
	k.s.fillHeader(&resp.Header, 0)
	return resp, nil
}

func (k *kvServer) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	if err := k.s.limits.checkSize(r); err != nil {
		return nil, err
	}
	if err := k.s.limits.checkDelete(r); err != nil {
		return nil, err
	}
	role := k.s.current()
	if err := k.s.authorize(ctx, needDelete(r)); err != nil {
		return nil, err
	}
	if !role.leading() {
		return forward(ctx, role, pb.NewKVClient, pb.KVClient.DeleteRange, r)
	}
	resp, err := role.Backend.DeleteRange(ctx, r)
	if err != nil {
		return nil, toGRPC(err)
	}
	k.s.fillHeader(&resp.Header, 0)
	return resp, nil
}

func (k *kvServer) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := k.s.limits.checkSize(r); err != nil {
		return nil, err
	}
	role := k.s.current()
	if role.leading() {
		// etcd checks the quota first, before validation and auth.
		if err := k.s.admitWrite(ctx, role, r); err != nil {
			return nil, err
		}
	}
	if err := k.s.limits.checkTxn(r); err != nil {
		return nil, err
	}
	if err := k.s.authorize(ctx, needTxn(r, role.leaseKeys())); err != nil {
		return nil, err
	}
	if !role.leading() {
		return forward(ctx, role, pb.NewKVClient, pb.KVClient.Txn, r)
	}
	resp, err := role.Backend.Txn(ctx, r)
	if err != nil {
		return nil, toGRPC(err)
	}
	k.s.fillTxnHeaders(resp)
	return resp, nil
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
	role := k.s.current()
	if !role.leading() {
		return forward(ctx, role, pb.NewKVClient, pb.KVClient.Compact, r)
	}
	rev, err := role.Backend.Compact(ctx, r.Revision, r.Physical)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.CompactionResponse{Header: k.s.header(rev)}, nil
}
