package etcdapi

import (
	"context"
	"errors"
	"io"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// This file is leader forwarding: a follower sends what only the leader
// serves (writes, compaction, leases, watches, alarms, defragmentation,
// auth and member changes) to the leader over its connection
// (Role.Leader), with the caller's metadata, and answers what the leader
// answered. Which failures to reach the leader may run again under the
// next role is reroute.go's concern; DESIGN.md, "Cluster roles and
// forwarding", gives the reasons.

// forwardCtx carries the caller's metadata (e.g. hasleader) to the leader.
func forwardCtx(ctx context.Context) context.Context {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		return metadata.NewOutgoingContext(ctx, md.Copy())
	}
	return ctx
}

// forwardErr keeps the leader's own answers; a failure to reach the leader
// becomes etcd's "leader changed", which clients retry only when it is safe.
//
// A forwarded call that ends Canceled must not be answered Canceled:
// clientv3 takes a Canceled answer while its own context is live for a
// per-attempt cancellation and sends the request again, writes included. A
// follower that changes leader closes its old connection, which cancels the
// calls in flight on it ("grpc: the client connection is closing") although
// the old leader may have applied them, so a write ran twice (the
// linearizability check, tests/linearizability, recorded one Put at two
// revisions). If the caller
// itself gave up, nobody reads the answer.
func forwardErr(err error) error {
	if errors.Is(err, context.Canceled) {
		return rpctypes.ErrGRPCLeaderChanged
	}
	st, ok := status.FromError(err)
	switch {
	case !ok:
		return rpctypes.ErrGRPCLeaderChanged
	case st.Code() == codes.Canceled:
		return rpctypes.ErrGRPCLeaderChanged
	case st.Code() == codes.Unavailable && !strings.HasPrefix(st.Message(), "etcdserver:"):
		return rpctypes.ErrGRPCLeaderChanged
	default:
		return err
	}
}

// noLeader is returned by a follower that knows no leader.
var noLeader = rpctypes.ErrGRPCNoLeader

// forward sends a call that only the leader serves (writes, compaction,
// leases) from this follower to the leader, with the caller's metadata, and
// answers what the leader answered, failures to reach it mapped by
// forwardErr; a call that never reached a leader is marked not served
// (reroute.go). Every such call is the same apart from its service and
// method, so a handler names just those, e.g.
//
//	return forward(ctx, role, pb.NewKVClient, pb.KVClient.Put, r)
//
// See DESIGN.md, "Cluster roles and forwarding".
func forward[Client, Req, Resp any](ctx context.Context, role *Role,
	newClient func(grpc.ClientConnInterface) Client,
	call func(Client, context.Context, Req, ...grpc.CallOption) (Resp, error),
	r Req) (Resp, error) {
	if role.Leader == nil {
		var none Resp
		return none, &notServed{noLeader}
	}
	var to peer.Peer
	resp, err := call(newClient(role.Leader), forwardCtx(ctx), r, grpc.Peer(&to))
	if err != nil {
		if to.Addr == nil {
			// gRPC had no connection to send it on: the leader never
			// saw it (reroute.go).
			return resp, &notServed{forwardErr(err)}
		}
		return resp, forwardErr(err)
	}
	return resp, nil
}

// proxyStream copies messages both ways between a client stream and a stream
// to the leader until either ends.
func proxyStream[Req, Resp any](ctx context.Context, recv func() (*Req, error), send func(*Resp) error, up interface {
	Send(*Req) error
	Recv() (*Resp, error)
	CloseSend() error
}) error {
	errc := make(chan error, 2)
	go func() {
		for {
			m, err := recv()
			if errors.Is(err, io.EOF) {
				_ = up.CloseSend()
				return
			}
			if err != nil {
				errc <- nil
				return
			}
			if err := up.Send(m); err != nil {
				errc <- forwardErr(err)
				return
			}
		}
	}()
	go func() {
		for {
			m, err := up.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					errc <- nil
				} else {
					errc <- forwardErr(err)
				}
				return
			}
			if err := send(m); err != nil {
				errc <- err
				return
			}
		}
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return nil
	}
}

// forwardStream is forward for a bidirectional stream (Watch,
// LeaseKeepAlive): it opens the same stream on the leader and copies
// messages both ways until either side ends. The caller has checked that a
// leader is known.
func forwardStream[Client any, Up interface {
	Send(*Req) error
	Recv() (*Resp, error)
	CloseSend() error
}, Req, Resp any](ctx context.Context, role *Role,
	newClient func(grpc.ClientConnInterface) Client,
	open func(Client, context.Context, ...grpc.CallOption) (Up, error),
	recv func() (*Req, error), send func(*Resp) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up, err := open(newClient(role.Leader), forwardCtx(ctx))
	if err != nil {
		return forwardErr(err)
	}
	return proxyStream(ctx, recv, send, up)
}
