package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/engramkv/engram/bench/result"
)

type resultT = result.Result

// allWorkloads is the report's row order.
var allWorkloads = []string{"create", "get", "update", "list", "delete", "mixed", "watch"}

// results returns one store's results of one workload, one per repeat.
func (h *harness) results(store, workload string) []resultT {
	var out []resultT
	for _, rep := range h.runs[store] {
		for _, r := range rep.Results {
			if r.Workload == workload {
				out = append(out, r)
			}
		}
	}
	return out
}

func median(rs []resultT, f func(resultT) float64) float64 {
	if len(rs) == 0 {
		return math.NaN()
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func tput(r resultT) float64 { return r.Throughput }
func p50(r resultT) float64  { return r.Latency.P50 }
func p90(r resultT) float64  { return r.Latency.P90 }
func p99(r resultT) float64  { return r.Latency.P99 }
func pmax(r resultT) float64 { return r.Latency.Max }

// ratio is a/b formatted, or "–" when either is missing.
func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func fnum(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return result.Num(v)
}

func fms(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return result.Millis(v)
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func (h *harness) ran() []string {
	var out []string
	for _, s := range h.stores {
		if _, skip := h.skipped[s]; !skip {
			out = append(out, s)
		}
	}
	return out
}

func (h *harness) writeReport() error {
	stores := h.ran()
	if err := h.writeChart(h.outChart, allWorkloads, stores); err != nil {
		return err
	}
	if err := h.writeRaw(); err != nil {
		return err
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	m := h.machine
	took := time.Since(h.started).Round(time.Second)

	w("# Benchmarks\n\n")
	w("Written by `%s` on %s (took %s). Every number below comes from that one run; rerun the same command to reproduce it on your machine.\n\n",
		h.mode, h.started.UTC().Format("2006-01-02 15:04 MST"), took)
	w("Each store runs alone on 127.0.0.1, fresh for every repeat, loaded by `engram bench` with the same parameters: requests shaped like kube-apiserver's ")
	w("(create `Txn If mod=0 Then Put`; update = linearizable Get then `Txn If mod=rev Then Put Else Get`; linearizable get; full paginated list pinned to the first page's revision; ")
	w("delete `Txn If mod=rev Then DeleteRange Else Get`; mixed %d%% get / %d%% update; watch: %d watchers on a prefix while keys are created at %g/s). ",
		90, 10, h.p.watchers, h.p.watchRate)
	w("%d clients over %d connections, %d-byte keys named in %s order (`engram bench --key-order`; random is how kube-apiserver's object names arrive), %d-byte values, a data set of %d keys (%d for delete), list pages of 500 with %d concurrent lists, %s per workload, %d repeats; the tables show the median of the repeats.\n\n",
		h.p.clients, h.p.connections, h.p.keySize, h.p.keyOrder, h.p.valueSize, h.p.dataSet, h.p.deleteKeys, h.p.listClients, h.p.duration, h.p.repeats)
	w("The load generator shares the machine with the server, so the **ceiling** (a gRPC server answering the same requests at once without storage, `bench/ceiling`) is the most any store can reach here. ")
	w("Per request it does what every store must and nothing more: gRPC decodes the request; the handler builds a response of the right shape and size (a get returns one key-value with a value of the benchmark's size, a list page the requested number of them, a write moves an atomic revision counter and answers each Txn op); gRPC encodes it. ")
	w("It runs with etcd's and Engram's transport settings (message limits, keepalive policy, 256 stream workers) and a collector as rare as a store's (GOGC=1000: its live heap is a few MiB, a store's hundreds). ")
	w("etcd and Engram on badger acknowledge a write only after it is fsynced (etcd by default; Engram's badger engine always); Engram on memkv keeps everything in memory.\n\n")

	w("## Machine\n\n")
	w("| | |\n| --- | --- |\n")
	w("| CPUs | %d × %s |\n", m.CPUs, m.CPUModel)
	w("| memory | %.1f GiB |\n", m.MemoryGiB)
	w("| kernel | %s |\n", m.Kernel)
	w("| fsync (4 KiB write + fdatasync, data directory's file system) | p50 %s, p99 %s (%d samples) |\n", m.FsyncP50.Round(time.Microsecond), m.FsyncP99.Round(time.Microsecond), m.FsyncCount)
	w("| load average before / after | %s / %s |\n", m.LoadBefore, m.LoadAfter)
	// Only the figure from before the run says something about others: the
	// one after includes the run itself.
	if busy(m.LoadBefore, m.CPUs) {
		w("\nOther processes were using the machine during this run (load average above). Stores are interleaved repeat by repeat, so they share the disturbance, but single medians can move by tens of percent; the spread column shows how far the repeats were apart.\n")
	}
	w("\n## Versions\n\n| | |\n| --- | --- |\n")
	for _, k := range []string{"engram", "etcd", "go"} {
		w("| %s | %s |\n", k, strings.ReplaceAll(h.versions[k], "|", "/"))
	}
	w("\n## Stores\n\n")
	for _, s := range h.stores {
		if why, skip := h.skipped[s]; skip {
			w("- **%s**: %s. *Not run: %s.*\n", s, storeInfo[s], why)
			continue
		}
		w("- **%s**: %s\n", s, storeInfo[s])
		if why := h.failed[s]; why != "" {
			w("  *Failed, no further runs against it: %s*\n", oneLine(why, 400))
		}
	}

	w("\n## Results\n\n")
	w("![throughput and p99 latency per workload](%s)\n\n", h.relToReport(h.outChart))
	w("Throughput is operations per second (list: complete paginated lists of %d keys per second; watch: events delivered per second). ", h.p.dataSet)
	w("Latency is per operation (update: the get and the transaction; list: all pages; watch: from the start of the write to the receipt of the event). ")
	w("× etcd and of ceiling compare median throughputs. Failed compares are transactions answered `Succeeded=false` (lost races between clients updating the same key), counted apart from errors.\n\n")
	w("Spread is the range of the repeats' throughputs relative to their median.\n\n")
	w("| workload | store | throughput | spread | p50 ms | p90 ms | p99 ms | max ms | × etcd | of ceiling | failed cmp | errors |\n")
	w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, wl := range allWorkloads {
		etcd := median(h.results(storeEtcd, wl), tput)
		ceil := median(h.results(storeCeiling, wl), tput)
		for _, s := range stores {
			rs := h.results(s, wl)
			if len(rs) == 0 {
				continue
			}
			t := median(rs, tput)
			var errs int64
			for _, r := range rs {
				errs += r.Errors
			}
			w("| %s | %s | %s %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %d |\n", wl, s, fnum(t), rs[0].Unit, spread(rs, t),
				fms(median(rs, p50)), fms(median(rs, p90)), fms(median(rs, p99)), fms(median(rs, pmax)),
				ratio(t, etcd), ratio(t, ceil), median(rs, func(r resultT) float64 { return float64(r.FailedCompares) }), errs)
		}
	}
	w("\nWatch delivery (every watcher must receive every acknowledged write once, in order; worst repeat):\n\n")
	w("| store | writes/s | events expected | received | missing | duplicates | out of order | delivered |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, s := range stores {
		var worst *result.Watch
		for _, r := range h.results(s, "watch") {
			if r.Watch != nil && (worst == nil || r.Watch.Delivered() < worst.Delivered()) {
				worst = r.Watch
			}
		}
		if worst == nil {
			continue
		}
		w("| %s | %s | %d | %d | %d | %d | %d | %.2f%% |\n", s, fnum(worst.WriteRate), worst.Expected, worst.Received, worst.Missing, worst.Duplicates, worst.OutOfOrder, 100*worst.Delivered())
	}
	h.writeCPU(&b, stores)
	if samples := h.errorSamples(stores); samples != "" {
		w("\nErrors seen (first distinct messages):\n\n%s", samples)
	}
	h.writeSQL(&b)

	w("\n## Memory\n\n")
	if h.p.rssObjects == 0 {
		w("Not measured in this run (`--rss-objects=0`).\n")
	} else {
		w("Resident memory (`VmRSS` from `/proc/PID/status`) of a fresh server, idle and 3 s after `engram bench --workloads=load` created %d objects of %d bytes ", h.p.rssObjects, h.p.valueSize)
		w("in create transactions of %d objects each (`If mod=0 … Then Put …`, %d clients: the same keys, values and versions as one create per object, in fewer revisions, so that a million objects load in seconds). ", h.p.rssBatch, h.p.clients)
		w("File-backed pages (etcd maps its bbolt file) are part of VmRSS and shown apart.\n\n")
		w("| store | idle | after loading | of which anonymous | of which file-backed | × etcd | load rate |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		etcdRSS := float64(h.rss[storeEtcd].Loaded.RSS)
		for _, s := range stores {
			r, ok := h.rss[s]
			if !ok {
				continue
			}
			note := ""
			if r.LoadError != "" {
				note = " (load failed: " + oneLine(r.LoadError, 200) + ")"
			}
			w("| %s | %s | %s%s | %s | %s | %s | %s objects/s |\n", s, mib(r.Idle.RSS), mib(r.Loaded.RSS), note, mib(r.Loaded.Anon), mib(r.Loaded.File),
				ratio(float64(r.Loaded.RSS), etcdRSS), fnum(r.LoadRate))
		}
	}

	h.writeSmallCluster(&b)
	h.writeSnapshot(&b)

	w("\n## Targets\n\n")
	w("Engram on badger, the default engine, unless a store is named; every figure from this run. ")
	w("Throughput against etcd compares medians of the same workload; the allocation rows read `BenchmarkRequests` from the Go benchmarks below against figures recorded at commit %s.\n\n", allocBaselineCommit)
	h.writeTargets(&b)

	w("\n## Commands\n\n")
	w("`%s` builds `bin/engram`, `bin/engram-ceiling` (`bench/cmd/ceiling`) and `bin/etcd`, `bin/etcdctl36`, `bin/etcdutl` (`bench/etcd`: etcd's own `etcdmain`, etcdctl and etcdutl at the version pinned in its go.mod), then runs `bench/harness`. ", h.mode)
	w("For every store and repeat it starts the server on ports picked at run time, then runs one `engram bench`. The first repeat's commands (ports and paths differ per run):\n\n```sh\n")
	for _, s := range stores {
		for _, c := range h.commands[s] {
			w("%s\n", c)
		}
		w("\n")
	}
	if c, ok := h.commands["load"]; ok {
		w("# memory: against a fresh server of each store\n%s\n", c[0])
	}
	for _, s := range stores {
		if r, ok := h.snap[s]; ok && r.SaveCmd != "" {
			w("\n# snapshot and restore, %s\n%s\n", s, r.SaveCmd)
			if r.RestoreCmd != "" {
				w("%s\n", r.RestoreCmd)
			}
		}
	}
	w("```\n\nRaw results of every run: [`%s`](%s).\n", h.relToReport(h.outJSON), h.relToReport(h.outJSON))

	h.writeProfiles(&b)
	if h.goBench {
		w("\n## Go benchmarks\n\n`make bench-go BENCH_GO_FLAGS=%s` (`go test -run='^$' -bench=. -benchmem %s` over the root module's packages but tests/, took %s):\n\n```\n%s```\n",
			h.goBenchFlags, h.goBenchFlags, h.goBenchTook.Round(time.Second), h.goBenchOut)
	}
	if err := h.writeScale(&b); err != nil {
		return err
	}
	h.writeChurn(&b)
	return os.WriteFile(h.outMD, []byte(b.String()), 0o644)
}

// writeSnapshot is the section on snapshot save and restore of the objects
// the memory measurement loaded.
func (h *harness) writeSnapshot(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## Snapshot and restore of %d objects\n\n", h.p.rssObjects)
	switch {
	case h.p.rssObjects == 0:
		w("Not measured in this run (`--rss-objects=0`).\n")
		return
	case !h.snapshot:
		w("Not measured in this run (`--snapshot=false`).\n")
		return
	case h.snapSkipped != "":
		w("Not measured in this run: %s.\n", h.snapSkipped)
		return
	}
	w("Each server loaded for the memory measurement above is backed up with `etcdctl snapshot save` (etcdctl 3.6, what operators run; the file ends with etcd's sha256 trailer), ")
	w("and the file is restored into a fresh data directory with the store's own tool: `etcdutl snapshot restore` for etcd, `engram snapshot restore` with the server's storage settings for Engram. ")
	w("A server is then started on the restored data and must hold the same number of keys at the same revision. ")
	w("Times are the commands' wall time, MiB/s the file's size over it. Server RSS is `VmRSS` sampled every 50 ms while the snapshot runs (peak anonymous leaves out file-backed pages such as etcd's mmapped bbolt file); ")
	w("the restore's peak is the restoring process's `ru_maxrss`, which counts the pages of the snapshot file it maps (both tools read it through bbolt's mmap).\n\n")
	w("etcd streams the bbolt file it already has (its size includes the free pages the load left). Engram first builds an etcd-format bbolt file from one consistent read, ")
	w("put in revision order by an external sort in `data-dir/tmp`, then streams it: its time includes building the file. `etcdutl snapshot restore` copies the file and rewrites its membership; ")
	w("`engram snapshot restore` bulk-loads every key with its revisions into the engine, sorted by key (badger's StreamWriter; batched commits on the other engines). ")
	w("Allocated per byte is what the server's Go heap allocated while making and sending the snapshot (`go_memstats_alloc_bytes_total` on its `/metrics`) over the file's size; ")
	w("× etcdutl is the restore's time over etcdutl's in the same run.\n\n")
	w("| store | keys | snapshot | size | MiB/s | allocated per byte | server RSS before | peak | peak anonymous | restore | × etcdutl | MiB/s | restore peak RSS | restored server |\n")
	w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	etcdRestore := 0.0
	if r, ok := h.snap[storeEtcd]; ok && r.SaveError == "" && r.RestoreError == "" {
		etcdRestore = r.RestoreSeconds
	}
	for _, s := range h.ran() {
		r, ok := h.snap[s]
		if !ok {
			continue
		}
		if r.SaveError != "" {
			w("| %s | %d | failed: %s | | | | | | | | | | | |\n", s, r.Keys, oneLine(r.SaveError, 300))
			continue
		}
		restore, ratio, rate, peak, started := "–", "–", "–", "–", "–"
		switch {
		case r.RestoreSkipped != "":
			restore = "– (" + r.RestoreSkipped + ")"
		case r.RestoreError != "":
			restore = "failed: " + oneLine(r.RestoreError, 300)
			peak = mib(r.RestorePeakRSS)
		default:
			restore, rate, peak = secs(r.RestoreSeconds), fms(mibps(r.Size, r.RestoreSeconds)), mib(r.RestorePeakRSS)
			if etcdRestore > 0 {
				ratio = fmt.Sprintf("%.1f×", r.RestoreSeconds/etcdRestore)
			}
			if r.StartError != "" {
				started = "**" + oneLine(r.StartError, 300) + "**"
			} else {
				started = fmt.Sprintf("ready in %s; same keys and revision (%d)", secs(r.StartSeconds), r.RestoredRevision)
			}
		}
		perByte := "–"
		if r.SaveAllocBytes > 0 && r.Size > 0 {
			perByte = fmt.Sprintf("%.1f B", r.SaveAllocBytes/float64(r.Size))
		}
		w("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s, r.Keys, secs(r.SaveSeconds), mib(r.Size), fms(mibps(r.Size, r.SaveSeconds)), perByte,
			mib(r.ServerBefore.RSS), mib(r.ServerPeak), mib(r.ServerPeakAnon), restore, ratio, rate, peak, started)
	}
}

// secs formats seconds for the tables.
func secs(v float64) string {
	if v >= 10 {
		return fmt.Sprintf("%.1f s", v)
	}
	return fmt.Sprintf("%.2f s", v)
}

func (h *harness) errorSamples(stores []string) string {
	var b strings.Builder
	for _, s := range stores {
		seen := map[string]bool{}
		for _, rep := range h.runs[s] {
			for _, r := range rep.Results {
				for _, e := range r.ErrorSamples {
					k := r.Workload + e
					if !seen[k] && len(seen) < 5 {
						seen[k] = true
						fmt.Fprintf(&b, "- %s, %s: `%s`\n", s, r.Workload, e)
					}
				}
			}
		}
	}
	return b.String()
}

// writeTargets is the targets table: the write path's targets
// (writetargets.go), then standing ones kept as regression checks: the
// ceiling fractions, the wasm host's cost and the churn.
func (h *harness) writeTargets(b *strings.Builder) {
	fmt.Fprintf(b, "| target | required | measured (etcd for reference) | |\n| --- | --- | --- | --- |\n")
	row := func(name, req, measured string, ok, k bool) {
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", name, req, measured, metWord(ok, k))
	}
	for _, r := range h.writeTargetRows() {
		row(r.name, r.required, r.measured, r.ok, r.known)
	}
	for _, c := range ceilingTargets {
		bd, et, mk, ce := h.medianTput(storeBadger, c.workload), h.medianTput(storeEtcd, c.workload), h.medianTput(storeMemkv, c.workload), h.medianTput(storeCeiling, c.workload)
		// memkv's ratio shows what the core reaches without a durable
		// engine, so a miss can be placed in the core or in the engine.
		row(c.workload+" / ceiling", fmt.Sprintf("≥ %.2f", c.need),
			fmt.Sprintf("%s (etcd %s, engram-memkv %s)", ratio(bd, ce), ratio(et, ce), ratio(mk, ce)), bd/ce >= c.need, measuredAll(bd, ce))
	}
	if _, skip := h.skipped[storeWasm]; skip || len(h.runs[storeWasm]) == 0 {
		row("memkv.wasm / native memkv, every workload", fmt.Sprintf("≥ %.2f", wasmNeed), "–", false, false)
	} else {
		lo, at := math.Inf(1), ""
		for _, wl := range allWorkloads {
			if r := h.medianTput(storeWasm, wl) / h.medianTput(storeMemkv, wl); r < lo {
				lo, at = r, wl
			}
		}
		row("memkv.wasm / native memkv, every workload", fmt.Sprintf("≥ %.2f (within 15%%)", wasmNeed), fmt.Sprintf("lowest %.2f× (%s)", lo, at), lo >= wasmNeed, measuredAll(lo))
	}
	for _, r := range h.churnTargets() {
		row(r.name, r.required, r.measured, r.ok, r.known)
	}
}

// ceilingTargets are earlier throughput targets for Engram on badger, as
// fractions of the ceiling's median throughput in the same run.
var ceilingTargets = []struct {
	workload string
	need     float64
}{{"create", 0.80}, {"update", 0.90}, {"delete", 0.80}, {"list", 0.85}, {"get", 0.90}}

// wasmNeed is the lowest memkv.wasm / native memkv throughput ratio the
// plugin host may cost on any workload.
const wasmNeed = 0.85

// targetRow is one line of the targets table contributed by another
// section (the churn run).
type targetRow struct {
	name, required, measured string
	ok, known                bool
}

// writeErrorsAndCommands ends a section whose stores ran one workload each
// (the small cluster, the churn): the errors each store answered what
// (requests, updates) with, then an open sh block of the commands that ran
// it, which the caller closes.
func writeErrorsAndCommands(b *strings.Builder, order []string, what string, run func(store string) (*result.Result, []string)) {
	for _, s := range order {
		if r, _ := run(s); r != nil && r.Errors > 0 {
			fmt.Fprintf(b, "\n%s answered %d %s with errors: %s\n", s, r.Errors, what, strings.Join(r.ErrorSamples, "; "))
		}
	}
	b.WriteString("\n```sh\n")
	for _, s := range order {
		_, cmds := run(s)
		for _, cmd := range cmds {
			fmt.Fprintf(b, "%s\n", cmd)
		}
		b.WriteString("\n")
	}
}

// writeRaw saves every run's report.
func (h *harness) writeRaw() error {
	if err := os.MkdirAll(filepath.Dir(h.outJSON), 0o755); err != nil {
		return fmt.Errorf("results dir: %w", err)
	}
	raw := struct {
		Runs     map[string][]*result.Report `json:"runs"`
		Memory   map[string]rssResult        `json:"memory"`
		Snapshot map[string]snapResult       `json:"snapshot,omitempty"`
	}{h.runs, h.rss, h.snap}
	b, err := json.MarshalIndent(raw, "", " ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	return os.WriteFile(h.outJSON, append(b, '\n'), 0o644)
}

// relToReport is path relative to the report's directory, for links.
func (h *harness) relToReport(path string) string {
	rel, err := filepath.Rel(filepath.Dir(h.outMD), path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(rel)
}

// oneLine squeezes an error (which may carry a server log tail) into one
// table-safe line of at most n bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// spread is (max-min)/median of the repeats' throughputs, e.g. "±4%" shown
// as "8%"; "–" with a single repeat.
func spread(rs []resultT, med float64) string {
	if len(rs) < 2 || med == 0 {
		return "–"
	}
	lo, hi := rs[0].Throughput, rs[0].Throughput
	for _, r := range rs {
		lo, hi = min(lo, r.Throughput), max(hi, r.Throughput)
	}
	return fmt.Sprintf("%.0f%%", 100*(hi-lo)/med)
}

// busy reports whether a /proc/loadavg triple shows more than half the CPUs
// taken on average over the last minute (before the run, nothing of the
// run's own is running).
func busy(load string, cpus int) bool {
	var one float64
	if _, err := fmt.Sscanf(load, "%g", &one); err != nil {
		return false
	}
	return one > float64(cpus)/2
}
