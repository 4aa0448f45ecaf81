package main

import (
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	ns := []int{10_000, 100_000, 1_000_000, 5_000_000}
	logOf := func(a, b float64) []float64 {
		var ys []float64
		for _, n := range ns {
			ys = append(ys, a+b*math.Log(float64(n)))
		}
		return ys
	}
	for _, tc := range []struct {
		name string
		ns   []int
		ys   []float64
		want string
	}{
		{"flat within noise", ns, []float64{100, 110, 95, 105}, growthFlat},
		{"linear with a fixed part", ns, []float64{60e6, 100e6, 500e6, 2300e6}, growthLinear},
		{"pure linear", ns, []float64{1, 10, 100, 500}, growthLinear},
		{"logarithmic", ns, logOf(10, 5), growthLog},
		{"slow affine growth is not linear", ns[1:], []float64{6382, 7172, 9445}, growthLog},
		{"falling", ns, []float64{100, 80, 60, 40}, growthFalls},
		{"faster than linear", ns, []float64{1, 100, 10_000, 250_000}, growthSuperlinear},
		{"two points, tenfold", ns[:2], []float64{1, 9}, growthLinear},
		{"two points, small growth", ns[:2], []float64{1, 1.5}, growthLog},
		{"one point", ns[:1], []float64{1}, growthUnknown},
		{"missing values are left out", ns, []float64{math.NaN(), 100, math.NaN(), 101}, growthFlat},
		{"all missing", ns, []float64{math.NaN(), math.NaN(), 0, -1}, growthUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if g := classify(tc.ns, tc.ys); g.Class != tc.want {
				t.Fatalf("classify(%v, %v) = %+v, want %s", tc.ns, tc.ys, g, tc.want)
			}
		})
	}
	g := classify(ns, []float64{1, 10, 100, 500})
	if g.From != 10_000 || g.To != 5_000_000 || math.Abs(g.Ratio-500) > 1e-9 || math.Abs(g.Exponent-1) > 0.01 {
		t.Fatalf("classify of a linear cost: %+v", g)
	}
}

func TestParseScale(t *testing.T) {
	ns, ss, err := parseScale("100000, 10000,1_000_000,10000", "etcd,engram-badger")
	if err != nil || len(ns) != 3 || ns[0] != 10_000 || ns[2] != 1_000_000 || len(ss) != 2 {
		t.Fatalf("parseScale = %v %v %v", ns, ss, err)
	}
	if ns, _, err := parseScale("", "etcd"); err != nil || len(ns) != 0 {
		t.Fatalf("empty --scale: %v %v", ns, err)
	}
	for _, bad := range [][2]string{{"10k", "etcd"}, {"0", "etcd"}, {"1000", "ceiling"}, {"1000", "nosuch"}, {"1000", ""}} {
		if _, _, err := parseScale(bad[0], bad[1]); err == nil {
			t.Errorf("parseScale(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

func TestObjects(t *testing.T) {
	for n, want := range map[int]string{10_000: "10k", 100_000: "100k", 1_000_000: "1M", 2_500_000: "2.5M", 5_000_000: "5M", 999: "999", 1500: "1.5k"} {
		if got := objects(n); got != want {
			t.Errorf("objects(%d) = %q, want %q", n, got, want)
		}
	}
}

// fakeScale is a scale run with made-up figures: etcd's RSS and recovery
// grow linearly, Engram's are flat, and Engram's list failed at 1M.
func fakeScale(t *testing.T) *harness {
	dir := t.TempDir()
	h := &harness{
		log:     slog.New(slog.DiscardHandler),
		outJSON: filepath.Join(dir, "results.json"), outChart: filepath.Join(dir, "chart.png"), outMD: filepath.Join(dir, "BENCHMARKS.md"),
		p:       params{keySize: 70, valueSize: 512, keyOrder: "random", clients: 300, rssBatch: 10},
		machine: machine{CPUs: 2},
	}
	h.scale = scaleRun{duration: 3 * time.Second, Points: []int{10_000, 100_000, 1_000_000}, Stores: []string{storeEtcd, storeBadger},
		Took: map[string]float64{storeEtcd: 100, storeBadger: 90}, Load: map[string]string{storeEtcd: "0.50 0.40 0.30"}}
	for _, n := range h.scale.Points {
		f := float64(n)
		for _, s := range h.scale.Stores {
			p := scalePoint{Store: s, Objects: n, Keys: int64(n), ListKeys: min(n, scaleListKeys), ListMillis: 500, Lists: 3,
				ListRSSBefore: 100 << 20, ListRSSPeak: 120 << 20,
				Get: scaleOp{Throughput: 10_000}, Create: scaleOp{Throughput: 5000}, DiskBytes: int64(1000 * f)}
			for _, w := range scaleWatchers {
				p.Watch = append(p.Watch, scaleWatch{Watchers: w, Rate: float64(scaleEvents) / float64(w), P99: 20, Expected: 100, Received: 100, Delivered: 1})
			}
			if s == storeEtcd {
				p.RSS = memory{RSS: int64(50<<20 + 1000*f)}
				p.Recovery = []float64{0.5 + f/1e5}
			} else {
				p.RSS = memory{RSS: 200 << 20, Anon: 100 << 20}
				p.Recovery = []float64{1, 1.1, 0.9}
				if n == 1_000_000 {
					p.ListError = "list returned 5 keys, want 100000"
				}
			}
			h.scale.Results = append(h.scale.Results, p)
		}
	}
	return h
}

func TestWriteScale(t *testing.T) {
	h := fakeScale(t)
	var b strings.Builder
	if err := h.writeScale(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"## Cost curves",
		"| store | 10k | 100k | 1M |",
		"### Server RSS",
		"- **etcd**: linear (",
		"**engram-badger**: flat (",
		"as its structure predicts",
		"*500 (10k keys)*",                                  // the 10k list is a smaller list
		"list returned 5 keys, want 100000",                 // the failed point is reported
		"| engram-badger | 200 MiB (20972; anon 100 MiB) |", // RSS per object in brackets
		"### Watch p99 with 10k watchers",
		"Load average when each store's run started: etcd 0.50 0.40 0.30",
		"(scale.png)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	// The recovery sentence of etcd derives "linear" from the numbers: made
	// flat, the same code must say flat.
	for i := range h.scale.Results {
		h.scale.Results[i].Recovery = []float64{1}
	}
	b.Reset()
	if err := h.writeScale(&b); err != nil {
		t.Fatal(err)
	}
	sec := b.String()[strings.Index(b.String(), "### Kill -9"):]
	if !strings.Contains(sec, "- **etcd**: flat (") || !strings.Contains(sec, "Its structure alone predicts linear") {
		t.Errorf("recovery section with flat figures:\n%s", sec)
	}
	if st, err := os.Stat(h.scaleChartPath()); err != nil || st.Size() == 0 {
		t.Fatalf("chart not written: %v", err)
	}
}

func TestWriteScaleNone(t *testing.T) {
	h := &harness{}
	var b strings.Builder
	if err := h.writeScale(&b); err != nil || b.Len() != 0 {
		t.Fatalf("without --scale: %q %v", b.String(), err)
	}
}

func TestDiskUsage(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), make([]byte, 10_000), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "b"), make([]byte, 5000), 0o644); err != nil {
		t.Fatal(err)
	}
	alloc, apparent, err := diskUsage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if apparent != 15_000 || alloc <= 0 {
		t.Fatalf("diskUsage = %d allocated, %d apparent", alloc, apparent)
	}
	if _, _, err := diskUsage(filepath.Join(dir, "missing")); err != nil {
		t.Fatalf("a missing directory is empty, got %v", err)
	}
}
