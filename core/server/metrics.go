package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/internal/etcdmetrics"
)

// rpcMetrics count and time every gRPC call by method and status code.
type rpcMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	streams  *prometheus.GaugeVec
	// leaderWaits counts requests that met no leader, or a leader
	// stepping down, and waited for the next one instead of failing.
	leaderWaits prometheus.Counter
}

func newRPCMetrics(reg prometheus.Registerer) *rpcMetrics {
	m := &rpcMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "engram", Subsystem: "grpc", Name: "requests_total", Help: "Unary gRPC requests by method and status code."}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "engram", Subsystem: "grpc", Name: "request_duration_seconds", Help: "Unary gRPC request latency.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}, []string{"method"}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "engram", Subsystem: "grpc", Name: "open_streams", Help: "Open gRPC streams by method (watch, lease keepalive)."}, []string{"method"}),
		leaderWaits: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "engram", Subsystem: "grpc", Name: "leader_waits_total",
			Help: "Requests that met no leader, or a leader stepping down, and waited for the next one instead of failing (cluster mode)."}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.latency, m.streams, m.leaderWaits)
	}
	return m
}

// Interceptors returns the server options that record request metrics and
// answer "no leader" to requests that require one while there is none. Pass
// them to grpc.NewServer together with GRPCServerOptions.
//
// Each kind of call has one interceptor doing all of it, in the order a
// chain of one interceptor per concern had: etcd's gRPC metrics and
// Engram's see every call, refused ones included; the learner check (a
// learner refuses what etcd's does, learner.go), the leader check, then
// the root-only check of admin calls; proposals are counted only once
// those let the request through, as etcd counts only proposals made; the
// MVCC and lease counters move for answered requests. gRPC's chain costs
// a closure per interceptor and call (DESIGN.md, "Per-request costs above
// the MVCC layer"). The payload bytes are counted in the codec, where
// etcd counts them, instead of in a stats handler, which makes gRPC build
// an event per header, message and trailer.
func (s *Server) Interceptors() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.unary),
		grpc.ChainStreamInterceptor(s.stream),
		grpc.ForceServerCodecV2(s.etcdM.Codec()),
	}
}

func (s *Server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	m := s.methods.get(info.FullMethod, "unary")
	m.started.Inc()
	m.received.Inc()
	resp, err := s.unaryChecked(ctx, info.FullMethod, req, m, handler)
	m.sent.Inc()
	elapsed := time.Since(start).Seconds()
	m.handledBy(grpcCode(err)).Inc()
	m.handling.Observe(elapsed)
	m.latencyObserver().Observe(elapsed)
	m.requestsBy(status.Code(err)).Inc()
	return resp, err
}

// unaryChecked runs the learner, leader and admin checks, then the
// handler, and counts what etcd counts of the request.
func (s *Server) unaryChecked(ctx context.Context, method string, req any, m *methodMetrics, handler grpc.UnaryHandler) (any, error) {
	if err := s.checkLearner(ctx, method, req); err != nil {
		return nil, err
	}
	if err := s.checkLeader(ctx); err != nil {
		return nil, err
	}
	if m.admin && s.api != nil {
		if err := s.api.AuthorizeAdminCall(ctx, req); err != nil {
			return nil, err
		}
	}
	// What etcd would do with the request is decided once, in
	// etcdmetrics: whether it is a raft proposal, and what its MVCC
	// transactions and lessor count.
	counted := s.etcdM.Begin(req)
	resp, err := handler(ctx, req)
	counted.End(resp, err)
	return resp, err
}

func (s *Server) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	m := s.methods.get(info.FullMethod, grpcType(info.IsClientStream, info.IsServerStream))
	m.started.Inc()
	open := m.openStreams()
	open.Inc()
	err := s.streamChecked(srv, ss, info, m, handler)
	open.Dec()
	m.handledBy(grpcCode(err)).Inc()
	m.handling.Observe(time.Since(start).Seconds())
	return err
}

func (s *Server) streamChecked(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, m *methodMetrics, handler grpc.StreamHandler) error {
	if err := s.checkLearner(ss.Context(), info.FullMethod, nil); err != nil {
		return err
	}
	if err := s.checkLeader(ss.Context()); err != nil {
		return err
	}
	cs := &countedStream{ServerStream: ss, m: m}
	switch info.FullMethod {
	case pb.Watch_Watch_FullMethodName:
		// etcd counts its watch streams.
		s.etcdM.WatchStreamOpened()
		defer s.etcdM.WatchStreamClosed()
	case pb.Lease_LeaseKeepAlive_FullMethodName:
		cs.keepAlive = s.etcdM
	}
	return handler(srv, cs)
}

// countedStream counts a stream's messages for etcd's gRPC metrics, every
// call as go-grpc-middleware does (a receive that ends the stream too),
// and, on a LeaseKeepAlive stream, hands what it sent to etcd's lessor
// metrics, which count the renewals.
type countedStream struct {
	grpc.ServerStream
	m         *methodMetrics
	keepAlive *etcdmetrics.Metrics // nil but on LeaseKeepAlive
}

func (c *countedStream) SendMsg(msg any) error {
	err := c.ServerStream.SendMsg(msg)
	c.m.sent.Inc()
	if c.keepAlive != nil && err == nil {
		c.keepAlive.KeepAliveSent(msg)
	}
	return err
}

func (c *countedStream) RecvMsg(msg any) error {
	err := c.ServerStream.RecvMsg(msg)
	c.m.received.Inc()
	return err
}
