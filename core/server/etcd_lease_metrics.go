package server

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// etcdLeaseMetrics are etcd's lessor metrics (etcd_debugging_lease_*),
// counted where Engram's lessor does the same: a grant and a revocation
// that succeeded, an expiry revoked, a keepalive answered with a TTL. etcd
// counts grants and revocations on every member as it applies them;
// Engram counts them on the node the request reached (and expiries on the
// leader), so in a cluster they sum over the nodes instead.
type etcdLeaseMetrics struct {
	granted, revoked, renewed prometheus.Counter
	ttls                      prometheus.Histogram
}

func newEtcdLeaseMetrics(reg prometheus.Registerer) *etcdLeaseMetrics {
	m := &etcdLeaseMetrics{
		granted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "etcd_debugging", Subsystem: "lease", Name: "granted_total",
			Help: "The total number of granted leases."}),
		revoked: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "etcd_debugging", Subsystem: "lease", Name: "revoked_total",
			Help: "The total number of revoked leases."}),
		renewed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "etcd_debugging", Subsystem: "lease", Name: "renewed_total",
			Help: "The number of renewed leases seen by the leader."}),
		ttls: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "etcd_debugging", Subsystem: "lease", Name: "ttl_total",
			Help: "Bucketed histogram of lease TTLs.", Buckets: prometheus.ExponentialBuckets(1, 2, 24)}),
	}
	if reg != nil {
		reg.MustRegister(m.granted, m.revoked, m.renewed, m.ttls)
	}
	return m
}

// unary counts successful grants (with the TTL granted) and revocations.
func (m *etcdLeaseMetrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err != nil {
		return resp, err
	}
	switch r := resp.(type) {
	case *pb.LeaseGrantResponse:
		m.granted.Inc()
		m.ttls.Observe(float64(r.TTL))
	case *pb.LeaseRevokeResponse:
		m.revoked.Inc()
	}
	return resp, err
}

// stream counts the renewals a LeaseKeepAlive stream answers: a response
// with a TTL (an unknown lease is answered with TTL 0 and renews nothing).
func (m *etcdLeaseMetrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != "/etcdserverpb.Lease/LeaseKeepAlive" {
		return handler(srv, ss)
	}
	return handler(srv, renewCounter{ServerStream: ss, renewed: m.renewed})
}

type renewCounter struct {
	grpc.ServerStream
	renewed prometheus.Counter
}

func (r renewCounter) SendMsg(msg any) error {
	err := r.ServerStream.SendMsg(msg)
	if ka, ok := msg.(*pb.LeaseKeepAliveResponse); ok && err == nil && ka.TTL > 0 {
		r.renewed.Inc()
	}
	return err
}
