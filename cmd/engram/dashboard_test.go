package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/engramkv/engram/cmd/engram/internal/config"
	"github.com/engramkv/engram/core/server"
)

// grafanaDashboard is the part of a Grafana dashboard the test reads.
type grafanaDashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// promMetricName matches the metric names in a PromQL expression: Engram's,
// etcd's (the role gauges it shares) and the Go runtime's and process's.
var promMetricName = regexp.MustCompile(`\b(?:engram|etcd|process|go)_[a-z0-9_]+\b`)

// TestGrafanaDashboard checks deploy/grafana/engram.json: valid JSON with a
// title, uid and panels with unique ids, every query naming only metrics a
// running Engram exports (scraped from /metrics as the binary serves it,
// over the wasm plugin host so its metrics are there too), and the areas
// it is for (requests, commits, watch, leases, compaction, plugin host,
// role) each covered.
func TestGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/grafana/engram.json")
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("engram.json: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("engram.json: title %q, uid %q, %d panels", d.Title, d.UID, len(d.Panels))
	}
	exprs := map[string]string{} // expression -> panel title
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs[tg.Expr] = p.Title
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			exprs[q["query"].(string)] = "variable " + v.Name
		}
	}

	exported, registered := scrapeRunningEngram(t)
	used := map[string]bool{}
	for expr, panel := range exprs {
		for _, name := range promMetricName.FindAllString(expr, -1) {
			base := name
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suf); ok && (exported[b] == dto.MetricType_HISTOGRAM || registered[b]) {
					base = b
				}
			}
			if _, ok := exported[base]; !ok && !registered[base] {
				t.Errorf("panel %q: %s is not exported by Engram", panel, name)
			}
			used[base] = true
		}
	}
	for _, want := range []string{
		"engram_grpc_requests_total", "engram_mvcc_commit_duration_seconds", "engram_watch_history_reads_total",
		"engram_watch_lag_cancels_total", "engram_lease_active", "engram_mvcc_compacted_revision",
		"engram_wasm_calls_total", "etcd_server_is_leader",
	} {
		if !used[want] {
			t.Errorf("the dashboard does not show %s", want)
		}
	}
}

// describedRegisterer records the names of the metrics registered through
// it: a labelled metric with no series yet (a plugin call error that has
// not happened) is not on /metrics, but is one Engram exports.
type describedRegisterer struct {
	prometheus.Registerer
	names map[string]bool
}

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r describedRegisterer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := descName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return r.Registerer.Register(c)
}

func (r describedRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// scrapeRunningEngram starts Engram as `engram serve` wires it (the
// binary's registry, openStore over the memkv test plugin, serverOptions),
// makes a few requests so that per-method series exist, and returns the
// metric families /metrics serves by name and type, and the names of every
// metric registered (series or not).
func scrapeRunningEngram(t *testing.T) (map[string]dto.MetricType, map[string]bool) {
	t.Helper()
	path, digest := memkvWasm(t)
	cfg := config.Default()
	cfg.DataDir = t.TempDir()
	cfg.Storage.Engine = config.EngineWasm
	cfg.Storage.Wasm.File = path
	cfg.Storage.Wasm.CacheDir = wasmCache(t, path)
	cfg.Storage.Wasm.SHA256 = digest
	logger := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	reg := newRegistry()
	described := describedRegisterer{Registerer: reg, names: map[string]bool{}}
	st, err := openStore(ctx, cfg, logger, described)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts, err := serverOptions(cfg, st, logger, described, []string{"http://" + l.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(server.GRPCServerOptions(opts, nil), srv.Interceptors()...)...)
	srv.Register(gs)
	go func() { _ = gs.Serve(l) }()
	ready := &readiness{}
	ready.setCheck(srv.Ready)
	hs := httptest.NewServer(opsHandler(reg, ready))
	t.Cleanup(func() {
		hs.Close()
		srv.Drain()
		gs.Stop()
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(cctx)
	})

	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := pb.NewKVClient(conn).Put(rctx, &pb.PutRequest{Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewKVClient(conn).Range(rctx, &pb.RangeRequest{Key: []byte("k")}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewLeaseClient(conn).LeaseGrant(rctx, &pb.LeaseGrantRequest{TTL: 60}); err != nil {
		t.Fatal(err)
	}

	resp, err := http.Get(hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]dto.MetricType{}
	for name, f := range fams {
		out[name] = f.GetType()
	}
	return out, described.names
}
