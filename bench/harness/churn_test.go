package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/engramkv/engram/bench/result"
)

func TestFirstLast(t *testing.T) {
	series := make([]float64, 600)
	for i := range series {
		series[i] = 100
		if i >= 540 {
			series[i] = 50
		}
	}
	first, last, win := firstLast(&result.Result{Series: series, SeriesInterval: 1})
	if first != 100 || last != 50 || win != time.Minute {
		t.Errorf("firstLast = %v, %v, %v; want 100, 50, 1m", first, last, win)
	}
	// Shorter than three minutes: thirds.
	first, last, win = firstLast(&result.Result{Series: []float64{1, 1, 2, 2, 3, 3}, SeriesInterval: 1})
	if first != 1 || last != 3 || win != 2*time.Second {
		t.Errorf("firstLast of 6 s = %v, %v, %v; want 1, 3, 2s", first, last, win)
	}
	if f, l, _ := firstLast(nil); f != 0 || l != 0 {
		t.Error("firstLast(nil) is not zero")
	}
}

func TestMeasureDisk(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, n int) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("badger/000001.sst", 64<<10)
	write("badger/00002.mem", 32<<10)
	write("member/snap/db", 16<<10)
	d, err := measureDisk(storeBadger, dir)
	if err != nil {
		t.Fatal(err)
	}
	if d.DB < 64<<10 || d.Total < d.DB+32<<10 {
		t.Errorf("badger disk use %+v: want the .sst as db and every file in the total", d)
	}
	e, err := measureDisk(storeEtcd, dir)
	if err != nil {
		t.Fatal(err)
	}
	if e.DB < 16<<10 || e.DB >= 64<<10 || e.Total != d.Total {
		t.Errorf("etcd disk use %+v: want only member/snap/db as db", e)
	}
}

// TestWriteChurn renders the section and chart from made-up results.
func TestWriteChurn(t *testing.T) {
	dir := t.TempDir()
	h := &harness{p: params{clients: 300, keySize: 70, valueSize: 512}, outMD: filepath.Join(dir, "B.md")}
	h.churn = churnConfig{duration: 10 * time.Minute, compactEvery: 5 * time.Minute, keys: 10_000,
		chart: filepath.Join(dir, "churn.png"), order: []string{storeEtcd, storeBadger}}
	series := func(v float64) []float64 {
		s := make([]float64, 600)
		for i := range s {
			s[i] = v
		}
		return s
	}
	h.churn.res = map[string]*churnResult{
		storeEtcd: {Store: storeEtcd, LiveBytes: 5_820_000, AtEnd: diskUse{Total: 900e6}, AfterCompact: diskUse{Total: 900e6},
			AfterReclaim: diskUse{Total: 130e6, DB: 8e6}, Reclaim: "`etcdctl defrag`",
			Result: &result.Result{Series: series(3000), SeriesInterval: 1, Compactions: []result.Compaction{{Revision: 42, At: 600}}}},
		storeBadger: {Store: storeBadger, LiveBytes: 5_820_000, AtEnd: diskUse{Total: 800e6}, AfterCompact: diskUse{Total: 400e6},
			AfterReclaim: diskUse{Total: 6e6, DB: 6e6}, Reclaim: "Engram's own",
			Result: &result.Result{Series: series(4000), SeriesInterval: 1}},
	}
	if err := h.writeChurnChart(h.churn.chart); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	h.writeChurn(&b)
	md := b.String()
	for _, want := range []string{
		"## Disk under churn",
		"| etcd | 5.8 MB | 900.0 MB | 900.0 MB | 130.0 MB (8.0 MB) |",
		"| 22.34× (db 1.37×) | not met | 3000 / 3000 ops/s (+0%) |",
		"| engram-badger | 5.8 MB | 800.0 MB | 400.0 MB | 6.0 MB (6.0 MB) |",
		"| 1.03× (db 1.03×) | met |",
		"42 at 600 s",
		"](churn.png)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("section lacks %q:\n%s", want, md)
		}
	}
	if _, err := os.Stat(h.churn.chart); err != nil {
		t.Errorf("chart: %v", err)
	}
	var none strings.Builder
	(&harness{}).writeChurn(&none)
	if none.Len() != 0 {
		t.Errorf("churn off, yet a section: %q", none.String())
	}
}
