package server

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Members learn who leads by reading the lease record at each election
// round, every renew interval. After a node changes that record (a hand-off
// written, a takeover) its peers would each learn up to a renew interval
// later, and requests wait for them meanwhile (etcdapi's reroute.go). So
// the node that changed it asks them to look now: a tiny gRPC service on
// the client port whose only call wakes the election loop (election's
// Wake). The leader also wakes a member whose record it changed (a
// promotion, a new peer URL): the woken node reads its own member record
// again before its election round (refreshSelf). The call carries no
// information and changes nothing but the timing of those reads, so it
// needs no authentication; wakes coalesce.

// wakeMethod is the service's one call.
const wakeMethod = "/engram.cluster.v1.Election/Wake"

// electionWaker is what the service's handler needs of the server.
type electionWaker interface {
	wakeElection(ctx context.Context)
}

var wakeService = grpc.ServiceDesc{
	ServiceName: "engram.cluster.v1.Election",
	HandlerType: (*electionWaker)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Wake",
		Handler: func(srv any, ctx context.Context, dec func(any) error, intercept grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			wake := func(context.Context, any) (any, error) {
				srv.(electionWaker).wakeElection(ctx)
				return &emptypb.Empty{}, nil
			}
			if intercept == nil {
				return wake(ctx, in)
			}
			return intercept(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: wakeMethod}, wake)
		},
	}},
}

func (s *Server) wakeElection(ctx context.Context) {
	if s.elector != nil {
		s.refreshSelf(ctx)
		s.elector.Wake()
	}
}

// wakePeer asks the member at url to run an election round now. Failing
// costs only time (the member looks at its next round), so it is logged at
// debug level.
func (s *Server) wakePeer(ctx context.Context, name, url string) {
	conn, err := s.dial(url)
	if err == nil {
		defer conn.Close()
		err = conn.Invoke(ctx, wakeMethod, &emptypb.Empty{}, &emptypb.Empty{})
	}
	if err != nil {
		s.log.Debug("could not wake a member's election", "member", name, "err", err)
	}
}

// wakePeers wakes every other registered member, all at once, and returns
// when each answered or ctx ended.
func (s *Server) wakePeers(ctx context.Context) {
	members, err := s.members(ctx)
	if err != nil {
		s.log.Debug("could not list the members to wake", "err", err)
		return
	}
	var wg sync.WaitGroup
	for _, m := range members {
		if m.Name == s.opts.Name || m.Name == "" {
			continue // this node, or one not started yet
		}
		wg.Go(func() { s.wakePeer(ctx, m.Name, m.PeerURLs[0]) })
	}
	wg.Wait()
}
