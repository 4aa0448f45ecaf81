package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/engramkv/engram/core/internal/lease"
)

type leaseServer struct {
	pb.UnimplementedLeaseServer
	s *Services
}

func (l *leaseServer) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	return serveWithRole(ctx, l.s, true, func(role *Role) (*pb.LeaseGrantResponse, error) {
		if !role.leading() {
			return forward(ctx, role, pb.NewLeaseClient, pb.LeaseClient.LeaseGrant, r)
		}
		if r.TTL > lease.MaxTTL {
			return nil, rpctypes.ErrGRPCLeaseTTLTooLarge
		}
		if err := l.s.admitQuota(ctx, role, r); err != nil {
			return nil, err
		}
		// A negative ID is granted as etcd grants it: only 0 means
		// "choose one".
		id := r.ID
		if id == 0 {
			id = role.Lessor.NewID()
		}
		ttl := role.Lessor.EffectiveTTL(r.TTL)
		rev, err := role.Backend.GrantLease(ctx, id, ttl)
		if err != nil {
			return nil, fromBackend(err)
		}
		return &pb.LeaseGrantResponse{Header: l.s.header(rev), ID: id, TTL: ttl}, nil
	})
}

func (l *leaseServer) LeaseRevoke(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	return serveWithRole(ctx, l.s, true, func(role *Role) (*pb.LeaseRevokeResponse, error) {
		if err := l.s.authorize(ctx, needLeaseRevoke(r.ID, role.leaseKeys())); err != nil {
			return nil, err
		}
		if !role.leading() {
			return forward(ctx, role, pb.NewLeaseClient, pb.LeaseClient.LeaseRevoke, r)
		}
		rev, err := role.Backend.RevokeLease(ctx, r.ID)
		if err != nil {
			return nil, fromBackend(err)
		}
		return &pb.LeaseRevokeResponse{Header: l.s.header(rev)}, nil
	})
}

func (l *leaseServer) LeaseKeepAlive(stream pb.Lease_LeaseKeepAliveServer) error {
	role := l.s.current()
	errc := make(chan error, 1)
	go func() { errc <- l.keepAlive(role, stream) }()
	select {
	case err := <-errc:
		return err
	case <-l.s.draining:
		return rpctypes.ErrGRPCStopped
	case <-role.ended:
		// The lessor this stream renewed on is gone; the client reconnects
		// and renews on the new leader.
		return rpctypes.ErrGRPCLeaderChanged
	}
}

func (l *leaseServer) keepAlive(role *Role, stream pb.Lease_LeaseKeepAliveServer) error {
	if !role.leading() {
		if role.Leader == nil {
			return noLeader
		}
		return forwardStream(stream.Context(), role, pb.NewLeaseClient, pb.LeaseClient.LeaseKeepAlive, stream.Recv, stream.Send)
	}
	for {
		req, err := stream.Recv()
		if err != nil {
			return recvEnd(err)
		}
		// etcd answers a keepalive for an unknown or expired lease with
		// TTL 0 rather than an error.
		ttl, err := role.Lessor.Renew(req.ID)
		if err != nil {
			ttl = 0
		}
		if err := stream.Send(&pb.LeaseKeepAliveResponse{Header: l.s.header(role.Backend.Rev()), ID: req.ID, TTL: ttl}); err != nil {
			return err
		}
	}
}

func (l *leaseServer) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	return serveWithRole(ctx, l.s, true, func(role *Role) (*pb.LeaseTimeToLiveResponse, error) {
		if err := l.s.authorize(ctx, needLeaseReads(role.leaseKeys(), r.ID)); err != nil {
			return nil, err
		}
		if !role.leading() {
			return forward(ctx, role, pb.NewLeaseClient, pb.LeaseClient.LeaseTimeToLive, r)
		}
		info, err := role.Lessor.Lookup(r.ID)
		if err != nil {
			// etcd reports a missing lease as TTL -1, not as an error.
			return &pb.LeaseTimeToLiveResponse{Header: l.s.header(role.Backend.Rev()), ID: r.ID, TTL: -1}, nil
		}
		resp := &pb.LeaseTimeToLiveResponse{Header: l.s.header(role.Backend.Rev()), ID: r.ID, TTL: info.Remaining, GrantedTTL: info.TTL}
		if r.Keys {
			resp.Keys = role.Lessor.Keys(r.ID)
		}
		return resp, nil
	})
}

func (l *leaseServer) LeaseLeases(ctx context.Context, r *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	return serveWithRole(ctx, l.s, true, func(role *Role) (*pb.LeaseLeasesResponse, error) {
		return l.leases(ctx, role, r)
	})
}

func (l *leaseServer) leases(ctx context.Context, role *Role, r *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	if err := l.s.authorize(ctx, needLeaseList(role)); err != nil {
		return nil, err
	}
	if !role.leading() {
		return forward(ctx, role, pb.NewLeaseClient, pb.LeaseClient.LeaseLeases, r)
	}
	ids := role.Lessor.List()
	resp := &pb.LeaseLeasesResponse{Header: l.s.header(role.Backend.Rev()), Leases: make([]*pb.LeaseStatus, len(ids))}
	for i, id := range ids {
		resp.Leases[i] = &pb.LeaseStatus{ID: id}
	}
	return resp, nil
}
