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
		snapshot: true,
		snap: map[string]snapResult{
			storeEtcd: {Objects: 1000, Keys: 1000, Revision: 101, SaveSeconds: 2, Size: 100 << 20, SaveAllocBytes: 150 << 20,
				ServerBefore: memory{RSS: 200 << 20}, ServerPeak: 300 << 20, ServerPeakAnon: 150 << 20,
				RestoreSeconds: 0.5, RestorePeakRSS: 40 << 20, StartSeconds: 1.25, RestoredKeys: 1000, RestoredRevision: 101,
				SaveCmd: "etcdctl snapshot save f", RestoreCmd: "etcdutl snapshot restore f"},
			storeBadger: {Objects: 1000, Keys: 1000, Revision: 101, SaveSeconds: 4, Size: 80 << 20,
				ServerBefore: memory{RSS: 100 << 20}, ServerPeak: 180 << 20, ServerPeakAnon: 170 << 20,
				RestoreSeconds: 20, RestorePeakRSS: 250 << 20, StartSeconds: 0.5, RestoredKeys: 999, RestoredRevision: 101,
				StartError: "restored store holds 999 keys at revision 101, the snapshotted one 1000 at 101"},
		},
		versions: map[string]string{},
		started:  time.Now(),
		goBenchOut: "BenchmarkRequests/bare/put-2     \t    2000\t     36671 ns/op\t     19170 server-cpu-ns/op\t    4855 B/op\t      55 allocs/op\n" +
			"BenchmarkRequests/bare/create-2  \t    2000\t     55945 ns/op\t     23578 server-cpu-ns/op\t    5327 B/op\t      63 allocs/op\n" +
			"BenchmarkRequests/full/put-2     \t    2000\t     59266 ns/op\t     43025 server-cpu-ns/op\t   19224 B/op\t     101 allocs/op\n" +
			"BenchmarkRequests/full/create-2  \t    2000\t     72000 ns/op\t     41678 server-cpu-ns/op\t   21735 B/op\t     105 allocs/op\n",
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
		"| get / ceiling | ≥ 0.90 | 0.90× (etcd 0.60×, engram-memkv –) | met |",
		"| create / ceiling | ≥ 0.80 | 0.88× (etcd 0.50×, engram-memkv –) | met |",
		"| update / ceiling | ≥ 0.90 | – (etcd –, engram-memkv –) | not measured |",
		"| memkv.wasm / native memkv, every workload | ≥ 0.85 | – | not measured |",
		"RSS after 1000 objects, engram-badger | ≤ etcd's | 100 MiB vs etcd 200 MiB (0.50×; anonymous 0 MiB vs 0 MiB) | met",
		"| create / etcd | ≥ 1.5× | 1.75× | met |",
		"| get / etcd | ≥ 1.5× | 1.50× | met |",
		"| update / etcd | ≥ 1.5× | – | not measured |",
		"| writer's serial time per create | ≤ 5 µs | – µs (one writer allows – creates/s) | not measured |",
		"| Engram's allocations per create (full server − bare gRPC) | ≤ ½ of 1869dae's 85 | 42 (105 − 63; -51%) | met |",
		"| Engram's allocations per put (full server − bare gRPC) | ≤ ½ of 1869dae's 84 | 46 (101 − 55; -45%) | **not met** |",
		"| Engram's allocations per get (full server − bare gRPC) | ≤ ½ of 1869dae's 36 | – | not measured |",
		"| small cluster, RSS and disk / etcd's | ≤ 1.5× | – | not measured |",
		"*Not run: no plugin.*",
		"](results/chart.png)",
		"etcd --x",
		"## Snapshot and restore of 1000 objects",
		"| etcd | 1000 | 2.00 s | 100 MiB | 50.0 | 1.5 B | 200 MiB | 300 MiB | 150 MiB | 0.50 s | 1.0× | 200 | 40 MiB | ready in 1.25 s; same keys and revision (101) |",
		"| engram-badger | 1000 | 4.00 s | 80 MiB | 20.0 | – | 100 MiB | 180 MiB | 170 MiB | 20.0 s | 40.0× | 4.00 | 250 MiB | **restored store holds 999 keys",
		"etcdutl snapshot restore f",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if _, err := os.Stat(h.outChart); err != nil {
		t.Errorf("chart: %v", err)
	}
	raw, err := os.ReadFile(h.outJSON)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"RestorePeakRSS": 41943040`) {
		t.Errorf("results.json lacks the snapshot figures:\n%s", raw)
	}
}

// TestSnapshotSectionNotMeasured checks the section says why it is empty.
func TestSnapshotSectionNotMeasured(t *testing.T) {
	for _, c := range []struct {
		h    harness
		want string
	}{
		{harness{p: params{rssObjects: 0}, snapshot: true}, "(`--rss-objects=0`)"},
		{harness{p: params{rssObjects: 10}}, "(`--snapshot=false`)"},
		{harness{p: params{rssObjects: 10}, snapshot: true, snapSkipped: "bin/etcdutl is missing"}, "Not measured in this run: bin/etcdutl is missing."},
	} {
		var b strings.Builder
		c.h.writeSnapshot(&b)
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("section %q lacks %q", b.String(), c.want)
		}
	}
}

// TestSampleRSS samples this process, whose resident memory is not zero.
func TestSampleRSS(t *testing.T) {
	// sampleRSS samples when it starts and again when stopped, so two
	// samples exist without waiting for its ticker.
	stop := sampleRSS(os.Getpid(), time.Millisecond)
	p := stop()
	if p.RSS <= 0 || p.Anon <= 0 || p.n < 2 {
		t.Errorf("peak %+v: want RSS, anonymous memory and several samples", p)
	}
}
