package server

import (
	"context"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/engramkv/engram/core/internal/etcdapi"
)

// A learner (etcdctl member add --learner) follows the leader but never
// campaigns, and serves only what an etcd 3.6 learner serves
// (etcdapi.LearnerServes): Status, serializable reads and snapshots. It
// refuses the rest with etcd's "rpc not supported for learner" rather than
// forwarding, as etcd's learner does, so a client moves to another member.
// Promotion takes effect without a restart: the leader wakes the node,
// which reads its record again (refreshSelf); a node that missed the
// wake-up reads it before it refuses a request and before it would claim.

// checkLearner refuses the call fullMethod with req (nil for a stream) on
// a learner when an etcd learner would.
func (s *Server) checkLearner(ctx context.Context, fullMethod string, req any) error {
	if !s.learner.Load() || etcdapi.LearnerServes(fullMethod, req) {
		return nil
	}
	s.refreshSelf(ctx)
	if s.learner.Load() {
		return rpctypes.ErrGRPCNotSupportedForLearner
	}
	return nil
}

// mayCampaign is the election's Candidate: a voting member may lead, a
// learner may not. It reads the record again first, so a promotion whose
// wake-up was lost still counts at the next election.
func (s *Server) mayCampaign(ctx context.Context) bool {
	s.refreshSelf(ctx)
	return !s.learner.Load()
}
