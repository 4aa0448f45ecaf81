package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/engramkv/engram/core/internal/etcdmetrics"
)

// leaseMetrics describe the leader's leases for Engram's dashboard: how many
// are live and how many ran out (grants, revocations and keepalives are
// engram_grpc_* by method).
type leaseMetrics struct {
	expired prometheus.Counter
	// etcd is etcd's metrics, which count an expiry under etcd's names.
	etcd *etcdmetrics.Metrics
}

// leaseExpired counts a lease revoked because its TTL ran out.
func (m *leaseMetrics) leaseExpired() {
	m.expired.Inc()
	m.etcd.LeaseExpired()
}

// newLeaseMetrics registers the lease metrics with reg, if non-nil. The
// live count reads the lessor of the leader state this node holds, if any;
// an expiry also moves etcd's counters in etcd.
func newLeaseMetrics(s *Server, reg prometheus.Registerer, etcd *etcdmetrics.Metrics) *leaseMetrics {
	m := &leaseMetrics{
		expired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "engram", Subsystem: "lease", Name: "expired_total",
			Help: "Leases revoked because their TTL ran out (their keys deleted), on this node while it led."}),
		etcd: etcd,
	}
	if reg == nil {
		return m
	}
	reg.MustRegister(m.expired, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "engram", Subsystem: "lease", Name: "active",
		Help: "Live leases held by this node as leader; 0 on a follower."},
		func() float64 {
			if !s.ready.Load() {
				return 0
			}
			s.mu.Lock()
			ls := s.leader
			s.mu.Unlock()
			if ls == nil {
				return 0
			}
			return float64(len(ls.lessor.List()))
		}))
	return m
}
