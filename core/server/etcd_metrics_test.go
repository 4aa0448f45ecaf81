package server_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/internal/etcdtest"
)

// metricsEngram starts Engram over badger (which reports its size) with a
// registry as cmd/engram builds it, serving /metrics as the binary does, and
// returns its gRPC endpoint and metrics URL.
func metricsEngram(t *testing.T) (endpoint, metricsURL string) {
	t.Helper()
	bs, err := badger.Open(badger.Options{Dir: t.TempDir(), GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bs.Close() })
	n := startMetricsNode(t, server.Options{Store: bs, Name: "metrics"})
	return n.endpoint, n.url
}

// metricsNode is an in-process Engram whose registry is served on url.
type metricsNode struct {
	endpoint, url string
	srv           *server.Server
	stop          func()
}

// startMetricsNode starts a server with opts (its Store and Name set; the
// listener, registry and logger are filled in here), stopped by stop or at
// cleanup.
func startMetricsNode(t *testing.T, opts server.Options) *metricsNode {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts.Logger = slog.New(slog.DiscardHandler)
	opts.Registerer = reg
	opts.AdvertiseClientURLs = []string{"http://" + l.Addr().String()}
	srv, err := server.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(server.GRPCServerOptions(opts, nil), srv.Interceptors()...)...)
	srv.Register(gs)
	go func() { _ = gs.Serve(l) }()
	hs := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	var once sync.Once
	stop := func() {
		once.Do(func() {
			srv.Drain()
			gs.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := srv.Close(ctx); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		hs.Close()
		stop()
	})
	return &metricsNode{endpoint: l.Addr().String(), url: hs.URL + "/metrics", srv: srv, stop: stop}
}

// scrape reads url's Prometheus text exposition with Prometheus' parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// exercise sends what a client's day is made of: writes, reads, a Txn, a
// failed request, a lease and a watch, so that every per-method series a
// scrape should show has been touched.
func exercise(t *testing.T, endpoint string) {
	t.Helper()
	ctx, conn := rawConn(t, endpoint)
	kvc, lc := pb.NewKVClient(conn), pb.NewLeaseClient(conn)
	for _, k := range []string{"a", "b", "c"} {
		if _, err := kvc.Put(ctx, &pb.PutRequest{Key: []byte(k), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kvc.Range(ctx, &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("z")}); err != nil {
		t.Fatal(err)
	}
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("t"), Value: []byte("v")}}}
	if _, err := kvc.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{put}}); err != nil {
		t.Fatal(err)
	}
	if _, err := kvc.Range(ctx, &pb.RangeRequest{}); err == nil { // no key: refused
		t.Fatal("Range without a key succeeded")
	}
	if _, err := lc.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60}); err != nil {
		t.Fatal(err)
	}
	w, err := pb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	create := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("a")}}}
	if err := w.Send(create); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil { // the creation's answer
		t.Fatal(err)
	}
	_ = w.CloseSend()
}

// dbSize is the DbSize Status reports.
func dbSize(t *testing.T, endpoint string) int64 {
	t.Helper()
	ctx, conn := rawConn(t, endpoint)
	st, err := pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st.DbSize
}

// mixinMetric is a metric the etcd mixin's alerts or dashboard read.
type mixinMetric struct {
	name   string
	typ    dto.MetricType
	labels []string
}

var grpcLabels = []string{"grpc_method", "grpc_service", "grpc_type"}

// mixinMetrics are the metrics of etcd's contrib/mixin alerts and dashboard
// that have a meaning in Engram (README.md, "Metrics", lists the others).
var mixinMetrics = []mixinMetric{
	{"etcd_server_has_leader", dto.MetricType_GAUGE, nil},
	{"etcd_server_leader_changes_seen_total", dto.MetricType_COUNTER, nil},
	{"etcd_server_proposals_failed_total", dto.MetricType_COUNTER, nil},
	{"etcd_disk_backend_commit_duration_seconds", dto.MetricType_HISTOGRAM, nil},
	{"etcd_mvcc_db_total_size_in_bytes", dto.MetricType_GAUGE, nil},
	{"etcd_mvcc_db_total_size_in_use_in_bytes", dto.MetricType_GAUGE, nil},
	{"etcd_network_client_grpc_received_bytes_total", dto.MetricType_COUNTER, nil},
	{"etcd_network_client_grpc_sent_bytes_total", dto.MetricType_COUNTER, nil},
	{"grpc_server_started_total", dto.MetricType_COUNTER, grpcLabels},
	{"grpc_server_handled_total", dto.MetricType_COUNTER, append([]string{"grpc_code"}, grpcLabels...)},
	{"grpc_server_handling_seconds", dto.MetricType_HISTOGRAM, grpcLabels},
	{"process_resident_memory_bytes", dto.MetricType_GAUGE, nil},
}

// mixinAbsent are the mixin's metrics with no meaning in Engram: raft
// peers, etcd's own WAL, and a backend quota Engram does not have.
var mixinAbsent = []string{
	"etcd_network_peer_sent_failures_total", "etcd_network_peer_round_trip_time_seconds",
	"etcd_network_peer_received_bytes_total", "etcd_network_peer_sent_bytes_total",
	"etcd_disk_wal_fsync_duration_seconds", "etcd_server_quota_backend_bytes",
}

// labelNames are the sorted label names of a family's series, all of which
// must carry the same ones.
func labelNames(t *testing.T, f *dto.MetricFamily) []string {
	t.Helper()
	var names []string
	for i, m := range f.GetMetric() {
		var n []string
		for _, l := range m.GetLabel() {
			n = append(n, l.GetName())
		}
		sort.Strings(n)
		if i > 0 && !slices.Equal(n, names) {
			t.Errorf("%s: series with labels %v and %v", f.GetName(), names, n)
		}
		names = n
	}
	return names
}

// TestEtcdMixinMetrics checks that every metric the etcd mixin's alerts and
// dashboard read from etcd is on Engram's /metrics, with etcd's type and
// label names, and carries what happened: a leader, its election, commits,
// client traffic, the calls made by method and code.
func TestEtcdMixinMetrics(t *testing.T) {
	t.Parallel()
	endpoint, url := metricsEngram(t)
	exercise(t, endpoint)
	fams := scrape(t, url)
	for _, want := range mixinMetrics {
		f, ok := fams[want.name]
		if !ok {
			t.Errorf("%s: missing", want.name)
			continue
		}
		if f.GetType() != want.typ {
			t.Errorf("%s: type %v, want %v", want.name, f.GetType(), want.typ)
		}
		want := slices.Sorted(slices.Values(want.labels))
		if got := labelNames(t, f); !slices.Equal(got, want) {
			t.Errorf("%s: labels %v, want %v", f.GetName(), got, want)
		}
	}
	for _, name := range mixinAbsent {
		if _, ok := fams[name]; ok {
			t.Errorf("%s: exported, but Engram has nothing it could measure", name)
		}
	}
	value := func(name string) float64 {
		m := fams[name].GetMetric()[0]
		return m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	if v := value("etcd_server_has_leader"); v != 1 {
		t.Errorf("etcd_server_has_leader %v, want 1", v)
	}
	if v := value("etcd_server_leader_changes_seen_total"); v != 1 {
		t.Errorf("etcd_server_leader_changes_seen_total %v, want 1 (its own election)", v)
	}
	// badger refreshes its size estimate once a minute, so a fresh store
	// may say 0; what matters is that it is the size Status reports.
	if v, want := value("etcd_mvcc_db_total_size_in_bytes"), float64(dbSize(t, endpoint)); v != want {
		t.Errorf("etcd_mvcc_db_total_size_in_bytes %v, Status says %v", v, want)
	}
	if v := value("etcd_network_client_grpc_received_bytes_total"); v <= 0 {
		t.Errorf("etcd_network_client_grpc_received_bytes_total %v", v)
	}
	if n := fams["etcd_disk_backend_commit_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n < 5 {
		t.Errorf("etcd_disk_backend_commit_duration_seconds counted %d commits, want at least the 5 writes", n)
	}
	handled := map[string]float64{}
	for _, m := range fams["grpc_server_handled_total"].GetMetric() {
		var key []string
		for _, l := range m.GetLabel() {
			key = append(key, l.GetValue())
		}
		handled[strings.Join(key, " ")] = m.GetCounter().GetValue()
	}
	// Labels in name order: grpc_code, grpc_method, grpc_service, grpc_type.
	for key, want := range map[string]float64{
		"OK Put etcdserverpb.KV unary":                3,
		"OK Txn etcdserverpb.KV unary":                1,
		"OK Range etcdserverpb.KV unary":              1,
		"InvalidArgument Range etcdserverpb.KV unary": 1,
		"OK LeaseGrant etcdserverpb.Lease unary":      1,
	} {
		if handled[key] != want {
			t.Errorf("grpc_server_handled_total{%s} = %v, want %v", key, handled[key], want)
		}
	}
}

// TestEtcdMetricsMatchEtcd scrapes a real etcd 3.6 (with
// --metrics=extensive, which adds grpc_server_handling_seconds) and Engram
// after the same requests, and checks that each etcd metric Engram exports
// is etcd's: same type, help, label names and histogram buckets.
func TestEtcdMetricsMatchEtcd(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t, etcdtest.Options{Args: []string{"--metrics=extensive"}})
	endpoint, url := metricsEngram(t)
	exercise(t, e.Endpoint)
	exercise(t, endpoint)
	etcd, engram := scrape(t, e.ClientURL+"/metrics"), scrape(t, url)
	var compared []string
	for name, f := range engram {
		if !strings.HasPrefix(name, "etcd_") && !strings.HasPrefix(name, "grpc_") {
			continue
		}
		compared = append(compared, name)
		ef, ok := etcd[name]
		if !ok {
			t.Errorf("%s: exported by Engram, not by etcd 3.6", name)
			continue
		}
		if f.GetType() != ef.GetType() {
			t.Errorf("%s: type %v, etcd %v", name, f.GetType(), ef.GetType())
		}
		if f.GetHelp() != ef.GetHelp() {
			t.Errorf("%s: help %q, etcd %q", name, f.GetHelp(), ef.GetHelp())
		}
		if got, want := labelNames(t, f), labelNames(t, ef); !slices.Equal(got, want) {
			t.Errorf("%s: labels %v, etcd %v", name, got, want)
		}
		if f.GetType() == dto.MetricType_HISTOGRAM {
			if got, want := bounds(f), bounds(ef); !slices.Equal(got, want) {
				t.Errorf("%s: buckets %v, etcd %v", name, got, want)
			}
		}
	}
	sort.Strings(compared)
	t.Logf("compared with etcd: %v", compared)
	if len(compared) < len(mixinMetrics)-1 {
		t.Errorf("only %d etcd metrics compared", len(compared))
	}
}

// bounds are the upper bounds of a histogram family's first series.
func bounds(f *dto.MetricFamily) []float64 {
	var b []float64
	for _, bk := range f.GetMetric()[0].GetHistogram().GetBucket() {
		b = append(b, bk.GetUpperBound())
	}
	return b
}

// rawConn is a plain gRPC connection to endpoint, without clientv3's
// retries, so every request a metrics test sends is counted once; it and
// the returned context (a hang guard, not a measurement) end with the test.
func rawConn(t *testing.T, endpoint string) (context.Context, *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return ctx, conn
}
