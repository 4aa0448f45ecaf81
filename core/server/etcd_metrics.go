package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/engramkv/engram/core/internal/etcdmetrics"
)

// newEtcdMetrics creates etcd's metrics (core/internal/etcdmetrics, which
// decides what etcd would count of a request) reading s, and etcd's
// grpc_server_* vectors, which the per-method table resolves
// (grpc_metrics.go); it registers both with reg, if non-nil.
func newEtcdMetrics(s *Server, reg prometheus.Registerer) (*etcdmetrics.Metrics, *grpcServerMetrics) {
	g := newGRPCServerMetrics()
	if reg != nil {
		reg.MustRegister(g.collectors()...)
	}
	m := etcdmetrics.New(reg, etcdmetrics.Sources{
		HasLeader:         func() bool { _, ok := s.Leader(); return ok },
		IsLeader:          s.IsLeader,
		Revision:          s.currentRev,
		LeaseKeys:         s.leaseKeyCount,
		Store:             s.opts.Store,
		QuotaBackendBytes: s.opts.QuotaBackendBytes,
	})
	return m, g
}

// currentRev is the revision this node serves: the leader's, or a
// follower's view of the shared store.
func (s *Server) currentRev() int64 {
	// The follower's reader is set before the server is ready; reading
	// ready first orders that write before this read.
	if !s.ready.Load() {
		return 0
	}
	s.mu.Lock()
	ls := s.leader
	s.mu.Unlock()
	switch {
	case ls != nil:
		return ls.backend.Rev()
	case s.reader != nil:
		return s.reader.Rev()
	}
	return 0
}

// leaseKeyCount is how many keys the leader's lessor has attached to lease
// id; 0 on a follower, which forwards the revocation to the leader.
func (s *Server) leaseKeyCount(id int64) int {
	s.mu.Lock()
	ls := s.leader
	s.mu.Unlock()
	if ls == nil {
		return 0
	}
	return len(ls.lessor.Keys(id))
}
