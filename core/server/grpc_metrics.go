package server

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// grpcServerMetrics are etcd's grpc_server_* metrics, with the names,
// help texts, labels and buckets of go-grpc-middleware's prometheus
// provider, the library etcd exports them with (the handling-time
// histogram is etcd's --metrics=extensive one). Engram counts them itself
// because the library looks every series up by its label values on every
// call and message, which cost about 10 allocations per request; here a
// method's series are resolved once (DESIGN.md, "Per-request costs above
// the MVCC layer").
type grpcServerMetrics struct {
	started, handled, received, sent *prometheus.CounterVec
	handling                         *prometheus.HistogramVec
}

func newGRPCServerMetrics() *grpcServerMetrics {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	return &grpcServerMetrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grpc_server_started_total",
			Help: "Total number of RPCs started on the server."}, labels),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grpc_server_handled_total",
			Help: "Total number of RPCs completed on the server, regardless of success or failure."}, append(labels, "grpc_code")),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grpc_server_msg_received_total",
			Help: "Total number of RPC stream messages received on the server."}, labels),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grpc_server_msg_sent_total",
			Help: "Total number of gRPC stream messages sent by the server."}, labels),
		handling: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "grpc_server_handling_seconds",
			Help:    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
			Buckets: prometheus.DefBuckets}, labels),
	}
}

func (m *grpcServerMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.started, m.handled, m.received, m.sent, m.handling}
}

// grpcCode is the code grpc_server_handled_total counts err under: the
// library's, which takes a context error for the status gRPC answers it
// with.
func grpcCode(err error) codes.Code {
	s, ok := status.FromError(err)
	if !ok {
		s = status.FromContextError(err)
	}
	return s.Code()
}

// numCodes is the number of gRPC's status codes (OK to Unauthenticated).
const numCodes = int(codes.Unauthenticated) + 1

// methodMetrics are the series one method moves on each call, each
// looked up once. A series still appears when it did while it was looked
// up per call: etcd's when the method is registered (as
// go-grpc-middleware's InitializeMetrics makes them), Engram's
// engram_grpc_* at the method's first call with a code.
type methodMetrics struct {
	method                  string // the full method name, as engram_grpc_* label it
	typ, service, shortName string // etcd's labels
	// admin: only root may call it while auth is on (etcdapi.IsAdminMethod).
	admin bool

	started, received, sent prometheus.Counter
	handling                prometheus.Observer
	handled                 [numCodes]series[prometheus.Counter]

	rpc      *rpcMetrics
	grpc     *grpcServerMetrics
	latency  series[prometheus.Observer]
	requests [numCodes]series[prometheus.Counter]
	streams  series[prometheus.Gauge]
}

// series is one series of a vector, looked up at its first use.
type series[T any] struct{ p atomic.Pointer[T] }

func (s *series[T]) get(lookup func() T) T {
	if p := s.p.Load(); p != nil {
		return *p
	}
	v := lookup()
	s.p.Store(&v)
	return v
}

// grpcType is the grpc_type label of a method, as the library names it.
func grpcType(clientStream, serverStream bool) string {
	switch {
	case !clientStream && !serverStream:
		return "unary"
	case clientStream && !serverStream:
		return "client_stream"
	case !clientStream:
		return "server_stream"
	}
	return "bidi_stream"
}

func newMethodMetrics(g *grpcServerMetrics, rpc *rpcMetrics, fullMethod, typ string, admin bool) *methodMetrics {
	service, method := "unknown", "unknown"
	if sm := strings.TrimPrefix(fullMethod, "/"); strings.Contains(sm, "/") {
		service, method, _ = strings.Cut(sm, "/")
	}
	return &methodMetrics{
		method:    fullMethod,
		typ:       typ,
		service:   service,
		shortName: method,
		admin:     admin,
		started:   g.started.WithLabelValues(typ, service, method),
		received:  g.received.WithLabelValues(typ, service, method),
		sent:      g.sent.WithLabelValues(typ, service, method),
		handling:  g.handling.WithLabelValues(typ, service, method),
		rpc:       rpc,
		grpc:      g,
	}
}

// handledBy is grpc_server_handled_total's series for code c.
func (m *methodMetrics) handledBy(c codes.Code) prometheus.Counter {
	lookup := func() prometheus.Counter {
		return m.grpc.handled.WithLabelValues(m.typ, m.service, m.shortName, c.String())
	}
	if int(c) >= numCodes {
		return lookup()
	}
	return m.handled[c].get(lookup)
}

// requestsBy is engram_grpc_requests_total's series for code c.
func (m *methodMetrics) requestsBy(c codes.Code) prometheus.Counter {
	lookup := func() prometheus.Counter { return m.rpc.requests.WithLabelValues(m.method, c.String()) }
	if int(c) >= numCodes {
		return lookup()
	}
	return m.requests[c].get(lookup)
}

// latencyObserver is engram_grpc_request_duration_seconds' series.
func (m *methodMetrics) latencyObserver() prometheus.Observer {
	return m.latency.get(func() prometheus.Observer { return m.rpc.latency.WithLabelValues(m.method) })
}

// openStreams is engram_grpc_open_streams' series.
func (m *methodMetrics) openStreams() prometheus.Gauge {
	return m.streams.get(func() prometheus.Gauge { return m.rpc.streams.WithLabelValues(m.method) })
}

// methodTable maps full method names to their metrics. It is written when
// services are registered and read on every call without a lock.
type methodTable struct {
	grpc  *grpcServerMetrics
	rpc   *rpcMetrics
	admin func(fullMethod string) bool

	mu sync.Mutex // serialises writers
	m  atomic.Pointer[map[string]*methodMetrics]
}

// register adds the methods of gs's services, creating etcd's series for
// each as go-grpc-middleware's InitializeMetrics does.
func (t *methodTable) register(gs *grpc.Server) {
	t.mu.Lock()
	defer t.mu.Unlock()
	next := t.copy()
	for service, info := range gs.GetServiceInfo() {
		for _, mi := range info.Methods {
			full := "/" + service + "/" + mi.Name
			if next[full] != nil {
				continue
			}
			m := newMethodMetrics(t.grpc, t.rpc, full, grpcType(mi.IsClientStream, mi.IsServerStream), t.admin(full))
			for c := range numCodes {
				m.handledBy(codes.Code(c))
			}
			next[full] = m
		}
	}
	t.m.Store(&next)
}

func (t *methodTable) copy() map[string]*methodMetrics {
	next := map[string]*methodMetrics{}
	if cur := t.m.Load(); cur != nil {
		for k, v := range *cur {
			next[k] = v
		}
	}
	return next
}

// get returns the metrics of fullMethod. A method registered after
// Register (none is in Engram) gets them at its first call.
func (t *methodTable) get(fullMethod, typ string) *methodMetrics {
	if cur := t.m.Load(); cur != nil {
		if m := (*cur)[fullMethod]; m != nil {
			return m
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	next := t.copy()
	m := next[fullMethod]
	if m == nil {
		m = newMethodMetrics(t.grpc, t.rpc, fullMethod, typ, t.admin(fullMethod))
		next[fullMethod] = m
		t.m.Store(&next)
	}
	return m
}
