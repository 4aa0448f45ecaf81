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

	"github.com/engramkv/engram/core/internal/lease"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/watch"
)

// Role is what this node does at the moment. The leader has a writable
// backend, a watch hub and a lessor; a follower has a read-only backend and,
// when a leader is known, a connection to it for everything else.
type Role struct {
	// Backend serves reads on every node and writes on the leader.
	Backend *mvcc.Backend
	// Hub and Lessor are set on the leader only.
	Hub    *watch.Hub
	Lessor *lease.Lessor
	// Leader is set on a follower that knows the leader.
	Leader *grpc.ClientConn
	// LeaderID is the member ID of the leader (0 when unknown).
	LeaderID uint64

	// ended is closed when the role is replaced: streams bound to it (local
	// watches of a leader that stepped down, forwarded ones to a leader that
	// changed) end with "leader changed" and clients resume elsewhere.
	ended chan struct{}
}

func (r *Role) leading() bool { return r.Hub != nil }

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
// the old leader may have applied them, so a write ran twice (issue 10's
// linearizability check recorded one Put at two revisions). If the caller
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
