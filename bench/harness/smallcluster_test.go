package main

import (
	"strings"
	"testing"

	"github.com/engramkv/engram/bench/result"
)

// TestWriteSmallCluster renders the section from made-up measurements: the
// ratios to etcd and the target's verdict, and a failed store's row.
func TestWriteSmallCluster(t *testing.T) {
	state := func(rss, disk int64) smallClusterState {
		return smallClusterState{Memory: memory{RSS: rss << 20, Anon: rss << 19, File: rss << 19}, Disk: diskUse{Total: disk << 20}}
	}
	h := &harness{small: smallCluster{enabled: true, pods: 5000, nodes: 500,
		order: []string{storeEtcd, storeBadger, storePebble},
		res: map[string]*smallClusterResult{
			storeEtcd:   {Result: &result.Result{LiveBytes: 19 << 20, Throughput: 5000}, AfterLoad: state(200, 400), AfterCompact: state(200, 400)},
			storeBadger: {Error: "engram bench: exit status 1"},
			storePebble: {Result: &result.Result{LiveBytes: 19 << 20, Throughput: 6000}, AfterLoad: state(290, 200), AfterCompact: state(250, 100)},
		}}}
	var b strings.Builder
	h.writeSmallCluster(&b)
	out := b.String()
	for _, want := range []string{
		"## Small cluster",
		"| engram-badger | failed: engram bench: exit status 1 |",
		"| engram-pebble | 19 MiB | 6000 | 290 MiB (145 MiB + 145 MiB) | 200 MiB | 250 MiB (125 MiB + 125 MiB) | 100 MiB | 1.45× / 1.25× | 0.50× / 0.25× | met | 0 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("section lacks %q:\n%s", want, out)
		}
	}
	h.small.res[storePebble].AfterLoad = state(310, 200)
	b.Reset()
	h.writeSmallCluster(&b)
	if !strings.Contains(b.String(), "| 1.55× / 1.25× | 0.50× / 0.25× | not met |") {
		t.Errorf("RSS 1.55× etcd's after the load is not flagged:\n%s", b.String())
	}
}
