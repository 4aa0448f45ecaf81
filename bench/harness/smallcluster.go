package main

// The small cluster: memory and disk of each store after
// the objects of a small Kubernetes cluster have gone through their life
// (`engram bench --workloads=small-cluster`), where most clusters are, beside
// the million-object memory measurement.

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/engramkv/engram/bench/result"
)

// smallCluster holds the small-cluster flags and what it measured.
type smallCluster struct {
	enabled     bool
	stores      string
	pods, nodes int
	settle      time.Duration
	order       []string
	res         map[string]*smallClusterResult
}

// smallClusterResult is one store's small cluster.
type smallClusterResult struct {
	Result *result.Result
	// AfterLoad is measured 3 s after the workload; AfterCompact after
	// compacting all history below the current revision (what
	// kube-apiserver's compactor does five minutes later) and waiting for
	// the data directory to stop changing.
	AfterLoad, AfterCompact smallClusterState
	Revision                int64
	SettleSeconds           float64
	Error                   string
	Commands                []string
}

type smallClusterState struct {
	Memory memory
	Disk   diskUse
}

// smallClusterLimit is the target: Engram within 1.5 times etcd's memory
// and disk.
const smallClusterLimit = 1.5

func (h *harness) addSmallClusterFlags(fs *flag.FlagSet) {
	c := &h.small
	fs.BoolVar(&c.enabled, "small-cluster", false, "measure memory and disk after a small cluster's objects went through their life (engram bench --workloads=small-cluster)")
	fs.StringVar(&c.stores, "small-cluster-stores", strings.Join([]string{storeEtcd, storeBadger, storePebble}, ","), "stores the small cluster runs against")
	fs.IntVar(&c.pods, "small-cluster-pods", 5000, "engram bench --cluster-pods")
	fs.IntVar(&c.nodes, "small-cluster-nodes", 500, "engram bench --cluster-nodes")
	fs.DurationVar(&c.settle, "small-cluster-settle", 3*time.Minute, "longest wait for a store's disk use to settle after the final compaction")
}

// runSmallCluster runs the small cluster against every store, one at a
// time on a fresh server.
func (h *harness) runSmallCluster(ctx context.Context) error {
	c := &h.small
	if !c.enabled {
		return nil
	}
	c.res = map[string]*smallClusterResult{}
	stores, err := diskStores("--small-cluster-stores", c.stores)
	if err != nil {
		return err
	}
	for _, store := range stores {
		c.order = append(c.order, store)
		res := &smallClusterResult{}
		c.res[store] = res
		if res.Error, err = h.measureStore(ctx, "small cluster", store, func() error { return h.smallClusterStore(ctx, store, res) }); err != nil {
			return err
		}
	}
	return nil
}

func (h *harness) smallClusterStore(ctx context.Context, store string, res *smallClusterResult) error {
	c := &h.small
	dir := filepath.Join(h.workDir, "small-cluster", store)
	srv, err := h.startStore(ctx, store, dir)
	if err != nil {
		return err
	}
	defer srv.stop()
	dataDir := argValue(srv.args, "--data-dir=")
	jsonPath := filepath.Join(dir, "small-cluster.json")
	args := []string{"bench", "--endpoints=" + srv.endpoint, "--workloads=small-cluster", "--cleanup=false",
		fmt.Sprintf("--clients=%d", h.p.clients), fmt.Sprintf("--connections=%d", h.p.connections),
		fmt.Sprintf("--list-clients=%d", h.p.listClients),
		fmt.Sprintf("--cluster-pods=%d", c.pods), fmt.Sprintf("--cluster-nodes=%d", c.nodes),
		"--json=" + jsonPath, "--quiet"}
	res.Commands = []string{srv.command(), "engram " + strings.Join(args, " ")}
	h.log.Info("small cluster", "store", store, "pods", c.pods, "nodes", c.nodes)
	if res.Result, err = h.runOneWorkload(ctx, srv, args, jsonPath); err != nil {
		return err
	}
	// As the memory measurement: let the flushes and compactions the load
	// started run before reading the figure.
	time.Sleep(3 * time.Second)
	if res.AfterLoad, err = smallClusterMeasure(srv, store, dataDir); err != nil {
		return err
	}
	if store != storeEtcd {
		h.saveHeapProfile(ctx, srv, store+"-small-cluster")
	}

	// kube-apiserver's compactor keeps five minutes of history: a cluster
	// at rest holds its objects and little else. Compact everything below
	// the current revision, as it will have done five minutes later, and
	// let each store do what it does by itself after that (no defrag).
	if _, res.Revision, err = h.countKeys(ctx, srv.endpoint); err != nil {
		return err
	}
	compact := []string{"--endpoints=" + srv.endpoint, "--command-timeout=10m", "compact", fmt.Sprint(res.Revision), "--physical"}
	if _, err := h.tool(ctx, h.etcdctlBin, compact...); err != nil {
		return err
	}
	res.Commands = append(res.Commands, "etcdctl "+strings.Join(compact, " "))
	start := time.Now()
	if err := waitDiskSettles(ctx, store, dataDir, c.settle); err != nil {
		return err
	}
	res.SettleSeconds = time.Since(start).Seconds()
	if res.AfterCompact, err = smallClusterMeasure(srv, store, dataDir); err != nil {
		return err
	}
	h.log.Info("small cluster done", "store", store, "rss after load", mib(res.AfterLoad.Memory.RSS), "disk after load", mib(res.AfterLoad.Disk.Total),
		"rss after compaction", mib(res.AfterCompact.Memory.RSS), "disk after compaction", mib(res.AfterCompact.Disk.Total))
	return nil
}

func smallClusterMeasure(srv *server, store, dataDir string) (smallClusterState, error) {
	m, err := srv.memory()
	if err != nil {
		return smallClusterState{}, err
	}
	d, err := measureDisk(store, dataDir)
	return smallClusterState{Memory: m, Disk: d}, err
}

// writeSmallCluster is the report's "Small cluster" section.
func (h *harness) writeSmallCluster(b *strings.Builder) {
	c := &h.small
	if !c.enabled {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## Small cluster\n\n")
	w("Memory and disk where most clusters are: `engram bench --workloads=small-cluster` replays, against a fresh server of each store, the objects of a cluster of %d nodes and %d pods as kube-apiserver writes them ", c.nodes, c.pods)
	w("(%d clients): every node and its heartbeat Lease created, the pods created, then 30 rounds in which every Lease is renewed, each pod goes through 4 status changes and each node's status is written 5 times (about five minutes of a cluster's life), ", h.p.clients)
	w("10 full paginated lists of the pods and of the nodes, and a rollout that deletes one pod in five and creates a replacement that goes through its own status changes. ")
	w("Writes are kube-apiserver's transactions (create `If mod=0`, update `If mod=rev Then Put Else Get`, retried on a conflict, delete `If mod=rev Then Delete`), every value fresh random bytes (incompressible). ")
	w("Sizes are those of the objects in protobuf: a pod 3 KiB (managed fields and a running pod's status: 2-4 KiB), a node 8 KiB (conditions, addresses and its image list: 6-12 KiB), a Lease 300 bytes. ")
	w("Live data is the keys and values of the objects left at the end. ")
	w("Memory is `VmRSS` (anonymous + file-backed) 3 s after the workload, and again after compacting everything below the current revision (`etcdctl compact --physical`: what kube-apiserver's compactor has done five minutes later) ")
	w("once the data directory has stopped changing for %s (at most %s): each store's own background work, no defrag. Disk is the allocated blocks of the data directory.\n\n", churnQuiet, c.settle)
	w("| store | live data | requests/s | RSS after load (anon + file) | disk after load | RSS after compaction (anon + file) | disk after compaction | RSS × etcd | disk × etcd | ≤ %.1f× etcd | errors |\n", smallClusterLimit)
	w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n")
	etcd := c.res[storeEtcd]
	for _, s := range c.order {
		r := c.res[s]
		if r.Error != "" && r.Result == nil {
			w("| %s | failed: %s | | | | | | | | | |\n", s, oneLine(r.Error, 300))
			continue
		}
		var live int64
		var tput float64
		var errs int64
		if r.Result != nil {
			live, tput, errs = r.Result.LiveBytes, r.Result.Throughput, r.Result.Errors
		}
		rssX, diskX, met := "–", "–", "–"
		if etcd != nil && etcd.AfterLoad.Memory.RSS > 0 && s != storeEtcd {
			rl := float64(r.AfterLoad.Memory.RSS) / float64(etcd.AfterLoad.Memory.RSS)
			rc := float64(r.AfterCompact.Memory.RSS) / float64(etcd.AfterCompact.Memory.RSS)
			dl := float64(r.AfterLoad.Disk.Total) / float64(etcd.AfterLoad.Disk.Total)
			dc := float64(r.AfterCompact.Disk.Total) / float64(etcd.AfterCompact.Disk.Total)
			rssX = fmt.Sprintf("%.2f× / %.2f×", rl, rc)
			diskX = fmt.Sprintf("%.2f× / %.2f×", dl, dc)
			met = "met"
			if max(rl, rc, dl, dc) > smallClusterLimit {
				met = "not met"
			}
		}
		state := func(st smallClusterState) string {
			return fmt.Sprintf("%s (%s + %s)", mib(st.Memory.RSS), mib(st.Memory.Anon), mib(st.Memory.File))
		}
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", s, mib(live), fnum(tput), state(r.AfterLoad), mib(r.AfterLoad.Disk.Total),
			state(r.AfterCompact), mib(r.AfterCompact.Disk.Total), rssX, diskX, met, errs)
	}
	w("\n× etcd is after load / after compaction. Requests/s is every request of the workload (writes and list pages) over its duration. ")
	w("Heap profiles of the Engram servers after the load: `profiles/<store>-small-cluster.heap.pprof` under the profile directory.\n")
	writeErrorsAndCommands(b, c.order, "requests", func(s string) (*result.Result, []string) { return c.res[s].Result, c.res[s].Commands })
	w("```\n")
}
