package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// TestMethodTableSeries: the series resolved once per method appear when
// the per-call lookups made them appear: etcd's for every registered
// method and code at registration (go-grpc-middleware's
// InitializeMetrics), Engram's and an unregistered method's only once
// moved.
func TestMethodTableSeries(t *testing.T) {
	t.Parallel()
	g, rpc := newGRPCServerMetrics(), newRPCMetrics(nil)
	tbl := &methodTable{grpc: g, rpc: rpc, admin: func(string) bool { return false }}
	gs := grpc.NewServer()
	pb.RegisterKVServer(gs, pb.UnimplementedKVServer{})
	tbl.register(gs)
	methods := len(pb.KV_ServiceDesc.Methods) + len(pb.KV_ServiceDesc.Streams)
	for name, c := range map[string]prometheus.Collector{"started": g.started, "received": g.received, "sent": g.sent, "handling": g.handling} {
		if n := seriesOf(c); n != methods {
			t.Errorf("%s: %d series after registration, want one per method (%d)", name, n, methods)
		}
	}
	if n := seriesOf(g.handled); n != methods*numCodes {
		t.Errorf("handled: %d series after registration, want %d", n, methods*numCodes)
	}
	if n := seriesOf(rpc.requests) + seriesOf(rpc.latency); n != 0 {
		t.Errorf("engram_grpc_*: %d series before any call", n)
	}

	m := tbl.get(pb.KV_Put_FullMethodName, "unary")
	if again := tbl.get(pb.KV_Put_FullMethodName, "unary"); again != m {
		t.Error("a registered method's metrics are made again")
	}
	m.requestsBy(codes.OK).Inc()
	m.requestsBy(codes.OK).Inc()
	if v := counterValue(rpc.requests.WithLabelValues(pb.KV_Put_FullMethodName, "OK")); v != 2 {
		t.Errorf("requests{Put, OK} = %v, want 2", v)
	}
	if n := seriesOf(rpc.requests); n != 1 {
		t.Errorf("requests: %d series, want the one moved", n)
	}

	other := tbl.get("/x.Y/Z", "unary")
	other.handledBy(codes.NotFound).Inc()
	if n := seriesOf(g.handled); n != methods*numCodes+1 {
		t.Errorf("handled: %d series after an unregistered method's call, want %d", n, methods*numCodes+1)
	}
	if v := counterValue(g.handled.WithLabelValues("unary", "x.Y", "Z", "NotFound")); v != 1 {
		t.Errorf("handled{x.Y/Z, NotFound} = %v, want 1", v)
	}
}

// seriesOf is how many series c has.
func seriesOf(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 1024)
	c.Collect(ch)
	close(ch)
	return len(ch)
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
