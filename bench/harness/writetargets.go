package main

// The write path's targets: Engram on its default engine against etcd in
// the same run, the single writer's serial time, memory and disk, watch
// latency, the SQL engines, and allocations per request against a recorded
// baseline. Every row says met, not met, or not measured; none is judged
// from a figure this run did not produce.

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
)

// Throughput targets: Engram on badger at least this many times etcd's
// median throughput on each workload, same run, same load.
const (
	etcdMultipleNeed = 1.5
	// writerSerialNeed is the most serial writer time a create may cost
	// (µs), which lets one writer allow about 200,000 creates/s.
	writerSerialNeed = 5.0
)

// etcdMultipleWorkloads are the workloads with a throughput target against
// etcd.
var etcdMultipleWorkloads = []string{"create", "update", "delete", "list", "mixed", "get"}

// allocBaseline is core/server's BenchmarkRequests at commit 1869dae, before
// the write path was reworked (medians of 10 runs, benchstat; allocations
// are exact): the full server on memkv and the bare gRPC server answering
// prepared responses. Engram's share of a request is full minus bare, and
// the target is that share at least halved.
var allocBaseline = map[string]struct{ full, bare float64 }{
	"put":    {139, 55},
	"create": {148, 63},
	"update": {163, 68},
	"get":    {90, 54},
}

// allocBaselineCommit names the tree allocBaseline was measured on.
const allocBaselineCommit = "1869dae"

var requestsBenchLine = regexp.MustCompile(`(?m)^BenchmarkRequests/(bare|full)/(\w+)-\d+\s.*?\s([\d.]+) allocs/op`)

// requestAllocs reads BenchmarkRequests' allocs/op from make bench-go's
// output: kind ("bare", "full") -> request -> allocs/op.
func requestAllocs(goBench string) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, m := range requestsBenchLine.FindAllStringSubmatch(goBench, -1) {
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		if out[m[1]] == nil {
			out[m[1]] = map[string]float64{}
		}
		out[m[1]][m[2]] = v
	}
	return out
}

// writeTargetRows are the targets table's rows for the write path.
func (h *harness) writeTargetRows() []targetRow {
	var rows []targetRow
	for _, wl := range etcdMultipleWorkloads {
		bd, pb, et := h.medianTput(storeBadger, wl), h.medianTput(storePebble, wl), h.medianTput(storeEtcd, wl)
		measured := ratio(bd, et)
		if !math.IsNaN(pb) {
			measured += " (engram-pebble " + ratio(pb, et) + ")"
		}
		// Where both processes share the machine, the CPU they spend per
		// operation bounds the throughput; the server's share says how
		// much of a miss is Engram's.
		if srv, etcdSrv := h.serverPerOp(storeBadger, wl), h.serverPerOp(storeEtcd, wl); measuredAll(srv, etcdSrv) {
			measured += fmt.Sprintf("; server CPU %s vs etcd's %s µs/op", fnum(srv), fnum(etcdSrv))
		}
		rows = append(rows, targetRow{name: wl + " / etcd", required: fmt.Sprintf("≥ %.1f×", etcdMultipleNeed),
			measured: measured, ok: bd >= etcdMultipleNeed*et, known: measuredAll(bd, et)})
	}

	wr := writerPerOp(h.cpu[storeBadger]["create"])
	rows = append(rows, targetRow{name: "writer's serial time per create", required: fmt.Sprintf("≤ %.0f µs", writerSerialNeed),
		measured: fmt.Sprintf("%s µs (one writer allows %s creates/s)", fmtUS(wr), fnum(oneWriterAllows(wr))),
		ok:       wr <= writerSerialNeed, known: measuredAll(wr)})

	er := float64(h.rss[storeEtcd].Loaded.RSS)
	for _, s := range []string{storeBadger, storePebble} {
		r, ok := h.rss[s]
		if !ok && s == storePebble {
			continue
		}
		v := float64(r.Loaded.RSS)
		rows = append(rows, targetRow{name: fmt.Sprintf("RSS after %d objects, %s", h.p.rssObjects, s), required: "≤ etcd's",
			measured: fmt.Sprintf("%s vs etcd %s (%s; anonymous %s vs %s)", mib(r.Loaded.RSS), mib(int64(er)), ratio(v, er), mib(r.Loaded.Anon), mib(h.rss[storeEtcd].Loaded.Anon)),
			ok:       v <= er, known: measuredAll(v, er)})
	}
	rows = append(rows, h.smallClusterTargets()...)

	worst := func(s string) float64 {
		v := math.NaN()
		for _, r := range h.results(s, "watch") {
			if r.Watch != nil && (math.IsNaN(v) || r.Watch.Delivered() < v) {
				v = r.Watch.Delivered()
			}
		}
		return v
	}
	d := worst(storeBadger)
	rows = append(rows, targetRow{name: fmt.Sprintf("watch delivery, %d watchers", h.p.watchers), required: "100%",
		measured: fmt.Sprintf("%.2f%% (etcd %.2f%%)", 100*d, 100*worst(storeEtcd)), ok: d == 1, known: measuredAll(d)})
	bp, ep := median(h.results(storeBadger, "watch"), p99), median(h.results(storeEtcd, "watch"), p99)
	rows = append(rows, targetRow{name: fmt.Sprintf("watch p99 delivery latency, %d watchers", h.p.watchers), required: "≤ etcd's",
		measured: fmt.Sprintf("%s ms (etcd %s ms)", fms(bp), fms(ep)), ok: bp <= ep, known: measuredAll(bp, ep)})

	rows = append(rows, h.sqlTargets()...)
	return append(rows, h.allocTargets()...)
}

// medianTput is the median throughput of a store's workload (NaN when it
// did not run).
func (h *harness) medianTput(store, wl string) float64 { return median(h.results(store, wl), tput) }

// measuredAll reports whether every figure was measured: a NaN or a zero
// (a store or workload that did not run) leaves a target "not measured".
func measuredAll(v ...float64) bool {
	for _, x := range v {
		if math.IsNaN(x) || x == 0 {
			return false
		}
	}
	return true
}

// serverPerOp is the median server CPU µs per operation of a store's
// workload (NaN when not measured).
func (h *harness) serverPerOp(store, wl string) float64 {
	var v []float64
	for _, u := range h.cpu[store][wl] {
		if u.Ops > 0 {
			v = append(v, float64(u.Server.Microseconds())/float64(u.Ops))
		}
	}
	return medianOf(v)
}

// smallClusterTargets are the small cluster's rows: each Engram store's
// RSS and allocated disk, after the load and after compaction, within
// smallClusterLimit of etcd's.
func (h *harness) smallClusterTargets() []targetRow {
	c := &h.small
	if !c.enabled {
		return []targetRow{{name: "small cluster, RSS and disk / etcd's", required: fmt.Sprintf("≤ %.1f×", smallClusterLimit), measured: "–"}}
	}
	etcd := c.res[storeEtcd]
	var rows []targetRow
	for _, s := range c.order {
		if s == storeEtcd {
			continue
		}
		r := c.res[s]
		row := targetRow{name: "small cluster, RSS and disk / etcd's, " + s, required: fmt.Sprintf("≤ %.1f×", smallClusterLimit), measured: "–"}
		if r != nil && r.Error == "" && etcd != nil && etcd.Error == "" && etcd.AfterLoad.Memory.RSS > 0 && etcd.AfterCompact.Disk.Total > 0 {
			x := func(a, b int64) float64 { return float64(a) / float64(b) }
			rl, rc := x(r.AfterLoad.Memory.RSS, etcd.AfterLoad.Memory.RSS), x(r.AfterCompact.Memory.RSS, etcd.AfterCompact.Memory.RSS)
			dl, dc := x(r.AfterLoad.Disk.Total, etcd.AfterLoad.Disk.Total), x(r.AfterCompact.Disk.Total, etcd.AfterCompact.Disk.Total)
			row.measured = fmt.Sprintf("RSS %.2f× / %.2f×, disk %.2f× / %.2f× (after load / after compaction)", rl, rc, dl, dc)
			row.ok, row.known = max(rl, rc, dl, dc) <= smallClusterLimit, true
		}
		rows = append(rows, row)
	}
	return rows
}

// allocTargets compare Engram's allocations per request (the full server
// on memkv less the bare gRPC server) in this run's Go benchmarks with the
// recorded baseline.
func (h *harness) allocTargets() []targetRow {
	now := requestAllocs(h.goBenchOut)
	var rows []targetRow
	for _, req := range []string{"put", "create", "update", "get"} {
		base := allocBaseline[req]
		before := base.full - base.bare
		row := targetRow{name: "Engram's allocations per " + req + " (full server − bare gRPC)",
			required: fmt.Sprintf("≤ ½ of %s's %.0f", allocBaselineCommit, before), measured: "–"}
		full, okF := now["full"][req]
		bare, okB := now["bare"][req]
		if okF && okB {
			after := full - bare
			row.measured = fmt.Sprintf("%.0f (%.0f − %.0f; %+.0f%%)", after, full, bare, 100*(after-before)/before)
			row.ok, row.known = after <= before/2, true
		}
		rows = append(rows, row)
	}
	return rows
}
