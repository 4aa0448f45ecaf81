package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// rpcMetrics count and time every gRPC call by method and status code.
type rpcMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	streams  *prometheus.GaugeVec
}

func newRPCMetrics(reg prometheus.Registerer) *rpcMetrics {
	m := &rpcMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "engram", Subsystem: "grpc", Name: "requests_total", Help: "Unary gRPC requests by method and status code."}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "engram", Subsystem: "grpc", Name: "request_duration_seconds", Help: "Unary gRPC request latency.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}, []string{"method"}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "engram", Subsystem: "grpc", Name: "open_streams", Help: "Open gRPC streams by method (watch, lease keepalive)."}, []string{"method"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.latency, m.streams)
	}
	return m
}

func (m *rpcMetrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	m.observe(info.FullMethod, start, err)
	return resp, err
}

func (m *rpcMetrics) observe(method string, start time.Time, err error) {
	m.latency.WithLabelValues(method).Observe(time.Since(start).Seconds())
	m.requests.WithLabelValues(method, status.Code(err).String()).Inc()
}

func (m *rpcMetrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	g := m.streams.WithLabelValues(info.FullMethod)
	g.Inc()
	defer g.Dec()
	return handler(srv, ss)
}

// Interceptors returns the server options that record request metrics and
// answer "no leader" to requests that require one while there is none. Pass
// them to grpc.NewServer together with GRPCServerOptions.
func (s *Server) Interceptors() []grpc.ServerOption {
	unaryLeader := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := s.checkLeader(ctx); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
	streamLeader := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := s.checkLeader(ss.Context()); err != nil {
			return err
		}
		return handler(srv, ss)
	}
	// etcd's gRPC metrics come first, as in etcd, so they see every call,
	// refused ones included; proposals are counted only once the leader
	// check let the request through, as etcd counts only proposals made.
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.etcdM.grpc.UnaryServerInterceptor(), s.rpc.unary, unaryLeader, s.adminAuth, s.etcdM.proposal, s.etcdM.mvcc.unary, s.leaseM.etcd.unary),
		grpc.ChainStreamInterceptor(s.etcdM.grpc.StreamServerInterceptor(), s.rpc.stream, streamLeader, s.etcdM.watchStream, s.leaseM.etcd.stream),
		grpc.StatsHandler(bytesHandler{m: s.etcdM}),
	}
}
