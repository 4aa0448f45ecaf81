package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/internal/election"
	"github.com/engramkv/engram/core/internal/etcdapi"
)

// errTimeoutLeaderTransfer is etcd's answer when the transferee does not
// take over in time; etcd has no gRPC error for it, so its clients get the
// server error's text with codes.Unknown (etcdserver/errors.ErrTimeoutLeaderTransfer).
var errTimeoutLeaderTransfer = status.Error(codes.Unknown, "etcdserver: request timed out, leader transfer took too long")

// membership carries out MoveLeader and the member changes for the etcd API
// on the leader (etcdapi forwards followers' requests to it).
type membership struct{ s *Server }

var _ etcdapi.Membership = membership{}

// MoveLeader hands leadership to a registered member that answers. The
// liveness check is a Status call to the target's peer URL: it costs
// nothing while no one moves leadership (a heartbeat in every member record
// would be a store write per member per interval) and asks exactly what the
// hand-off needs, that the target's process runs and serves. A target that
// dies after answering never claims, and the election gives leadership back
// within one lease (package election, "Hand-off").
func (m membership) MoveLeader(ctx context.Context, target uint64) error {
	s := m.s
	member, _, err := m.findIn(ctx, target)
	switch {
	case errors.Is(err, rpctypes.ErrGRPCMemberNotFound):
		return rpctypes.ErrGRPCBadLeaderTransferee
	case err != nil:
		return err
	case member.IsLearner || member.Name == "":
		// etcd moves leadership only to a started voting member.
		return rpctypes.ErrGRPCBadLeaderTransferee
	}
	if member.Name != s.opts.Name {
		if err := m.probe(ctx, member); err != nil {
			s.log.Warn("move-leader: the target does not answer", "target", member.Name, "err", err)
			return rpctypes.ErrGRPCBadLeaderTransferee
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		// etcdctl always sets a deadline; a client that does not still gets
		// an answer once a lease could have changed hands twice.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*s.opts.Cluster.LeaseDuration)
		defer cancel()
	}
	start := time.Now()
	s.log.Info("move-leader: handing leadership off", "target", member.Name)
	// The target looks at the record at once instead of at its next round
	// (wake.go); writes wait meanwhile.
	written := func() { go s.wakePeer(ctx, member.Name, member.PeerURLs[0]) }
	if member.Name == s.opts.Name {
		written = nil
	}
	switch err := s.elector.Handoff(ctx, member.Name, written); {
	case err == nil:
		s.log.Info("move-leader: done", "leader", member.Name, "took", time.Since(start))
		return nil
	case errors.Is(err, election.ErrNotLeader):
		return rpctypes.ErrGRPCNotLeader
	case errors.Is(err, election.ErrHandoffFailed):
		s.log.Warn("move-leader: the target did not take over", "target", member.Name, "err", err)
		return errTimeoutLeaderTransfer
	default:
		return fmt.Errorf("move leader to %q: %w", member.Name, err)
	}
}

// probe asks the member's own server, at its peer URL, for its Status and
// checks that the process answering is that member.
func (m membership) probe(ctx context.Context, member *pb.Member) error {
	_, err := m.probeRelease(ctx, member)
	return err
}

// probeRelease is probe, and the release the member says it runs ("" for
// a member that names none: 0.9.0).
func (m membership) probeRelease(ctx context.Context, member *pb.Member) (string, error) {
	if len(member.PeerURLs) == 0 {
		return "", errors.New("no peer URL registered")
	}
	conn, err := m.s.dial(member.PeerURLs[0])
	if err != nil {
		return "", err
	}
	defer conn.Close()
	pctx, cancel := context.WithTimeout(ctx, m.s.opts.Cluster.LeaseDuration)
	defer cancel()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		// The caller's token: with auth on, Status needs a known caller.
		pctx = metadata.NewOutgoingContext(pctx, md.Copy())
	}
	var header metadata.MD
	resp, err := pb.NewMaintenanceClient(conn).Status(pctx, &pb.StatusRequest{}, grpc.Header(&header))
	rel := ""
	if v := header.Get(etcdapi.ReleaseHeader); len(v) > 0 {
		rel = v[0]
	}
	switch status.Code(err) {
	case codes.OK:
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return "", fmt.Errorf("status: %w", err)
	default:
		// Refused (say, a caller known only by its certificate, which the
		// dial does not carry), but refused by a running server.
		return rel, nil
	}
	if resp.Header.GetMemberId() != member.ID {
		return "", fmt.Errorf("the URL answers as member %x", resp.Header.GetMemberId())
	}
	return rel, nil
}
