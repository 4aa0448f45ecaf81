package main

import (
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/engramkv/engram/bench/result"
)

func TestMedian(t *testing.T) {
	rs := func(v ...float64) []resultT {
		var out []resultT
		for _, x := range v {
			out = append(out, resultT{Throughput: x})
		}
		return out
	}
	for _, c := range []struct {
		in   []resultT
		want float64
	}{{rs(3, 1, 2), 2}, {rs(4, 1, 3, 2), 2.5}, {rs(7), 7}} {
		if got := median(c.in, tput); got != c.want {
			t.Errorf("median %v = %v, want %v", c.in, got, c.want)
		}
	}
	if !math.IsNaN(median(nil, tput)) {
		t.Error("median of nothing is not NaN")
	}
}

// TestWriteReport renders a report from made-up runs and checks the rows,
// the ratios and the targets table.
func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	h := &harness{
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		stores:   []string{storeCeiling, storeEtcd, storeBadger, storeWasm},
		skipped:  map[string]string{storeWasm: "no plugin"},
		runs:     map[string][]*result.Report{},
		commands: map[string][]string{storeEtcd: {"etcd --x", "engram bench --y"}},
		rss:      map[string]rssResult{storeEtcd: {Loaded: memory{RSS: 200 << 20}}, storeBadger: {Loaded: memory{RSS: 100 << 20}}},
		versions: map[string]string{},
		started:  time.Now(),
		p:        params{repeats: 1, rssObjects: 1000, watchers: 10, duration: time.Second},
		outMD:    filepath.Join(dir, "B.md"),
		outChart: filepath.Join(dir, "results", "chart.png"),
		outJSON:  filepath.Join(dir, "results", "results.json"),
	}
	mk := func(get, create float64) *result.Report {
		return &result.Report{Results: []result.Result{
			{Workload: "get", Throughput: get, Unit: "ops/s", Latency: result.Latency{P99: 5}},
			{Workload: "create", Throughput: create, Unit: "ops/s", Latency: result.Latency{P99: 9}},
			{Workload: "watch", Throughput: 100, Unit: "events/s", Watch: &result.Watch{Watchers: 10, Writes: 10, Expected: 100, Received: 100}},
		}}
	}
	h.runs[storeCeiling] = []*result.Report{mk(10000, 8000)}
	h.runs[storeEtcd] = []*result.Report{mk(6000, 4000)}
	h.runs[storeBadger] = []*result.Report{mk(9000, 7000)}
	if err := h.writeReport(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(h.outMD)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	for _, want := range []string{
		"| get | engram-badger | 9000 ops/s |",
		"| 1.50× | 0.90× |", // get: ×etcd, of ceiling
		"| get / ceiling | ≥ 0.85 | 0.90× (etcd 0.60×) | met |",
		"| create / ceiling | ≥ 0.75 | 0.88× (etcd 0.50×) | met |",
		"RSS after 1000 objects | ≤ etcd's | 100 MiB vs etcd 200 MiB (0.50×) | met",
		"*Not run: no plugin.*",
		"](results/chart.png)",
		"etcd --x",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if _, err := os.Stat(h.outChart); err != nil {
		t.Errorf("chart: %v", err)
	}
}
