package main

// Disk under churn: minutes of kube-apiserver-shaped
// updates on a fixed set of keys with kube-apiserver's compactor running,
// then each store's own space reclamation; disk use against the live data,
// and throughput over time.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/engramkv/engram/bench/result"
)

// churnConfig holds the churn flags and what the churn measured.
type churnConfig struct {
	duration, compactEvery time.Duration
	keys                   int
	stores                 string
	chart, results         string
	// from names a churn.json of an earlier run to report again instead of
	// measuring.
	from string
	// settle bounds the wait for Engram's own reclamation after the final
	// compaction: it starts once the deletes have stopped for a while.
	settle time.Duration
	// running is set while a churn server starts: an Engram server then
	// logs at info, which is where its reclamations show (servers.go).
	running bool

	order []string
	res   map[string]*churnResult
}

// churnResult is one store's churn.
type churnResult struct {
	Store string `json:"store"`
	// Keys and Revision are the server's key count and revision after the
	// run (Keys includes kube-apiserver's compact_rev_key).
	Keys     int64 `json:"keys"`
	Revision int64 `json:"revision"`
	// LiveBytes is the live data: the churn's keys × (key size + value
	// size), what a store must keep at the least.
	LiveBytes int64 `json:"live_bytes"`
	// Disk use (allocated blocks of every file in the data directory) at
	// the end of the churn (history since the compactor's last round still
	// kept), after compacting everything below the current revision
	// (physical), and after the store's own reclamation.
	AtEnd          diskUse `json:"at_end"`
	AfterCompact   diskUse `json:"after_compact"`
	AfterReclaim   diskUse `json:"after_reclaim"`
	CompactSeconds float64 `json:"compact_seconds"`
	// Reclaim says what reclaimed the space and ReclaimSeconds how long it
	// took (for Engram: until the disk stopped shrinking).
	Reclaim        string  `json:"reclaim"`
	ReclaimSeconds float64 `json:"reclaim_seconds"`
	// ReclaimLog holds the server's log lines about reclaiming space, over
	// the whole run: when each reclamation ran and what it did.
	ReclaimLog []string       `json:"reclaim_log,omitempty"`
	Result     *result.Result `json:"result,omitempty"`
	Error      string         `json:"error,omitempty"`
	Commands   []string       `json:"commands,omitempty"`
}

// diskUse splits a data directory into the database (etcd's bbolt file;
// badger's tables and value log) and the logs (etcd's WAL and snapshots;
// badger's memtable write-ahead files and metadata).
type diskUse struct {
	Total int64 `json:"total"`
	DB    int64 `json:"db"`
}

func (h *harness) addChurnFlags(fs *flag.FlagSet) {
	c := &h.churn
	fs.DurationVar(&c.duration, "churn", 0, "disk under churn: minutes of updates on --churn-keys keys, compacting as kube-apiserver does (0: skip)")
	fs.IntVar(&c.keys, "churn-keys", 10_000, "keys the churn updates")
	fs.DurationVar(&c.compactEvery, "churn-compact-every", 5*time.Minute, "the churn's compaction interval (kube-apiserver's --etcd-compaction-interval)")
	fs.StringVar(&c.stores, "churn-stores", storeEtcd+","+storeBadger, "stores the churn runs against")
	fs.StringVar(&c.chart, "churn-chart", "bench/results/churn.png", "chart of the churn's throughput over time")
	fs.StringVar(&c.results, "churn-results", "bench/results/churn.json", "the churn's raw results")
	fs.StringVar(&c.from, "churn-from", "", "report the churn.json of an earlier run (with --churn set to its duration) instead of measuring")
	fs.DurationVar(&c.settle, "churn-settle", 3*time.Minute, "longest wait for Engram's own reclamation after the final compaction")
}

// runChurn runs the churn against every --churn-stores store, one at a
// time on a fresh server, and keeps the results for the report.
func (h *harness) runChurn(ctx context.Context) error {
	c := &h.churn
	if c.duration <= 0 {
		return nil
	}
	c.res = map[string]*churnResult{}
	if c.from != "" {
		b, err := os.ReadFile(c.from)
		if err != nil {
			return fmt.Errorf("--churn-from: %w", err)
		}
		if err := json.Unmarshal(b, &c.res); err != nil {
			return fmt.Errorf("--churn-from %s: %w", c.from, err)
		}
	}
	stores, err := diskStores("--churn-stores", c.stores)
	if err != nil {
		return err
	}
	for _, store := range stores {
		if c.from != "" {
			if _, ok := c.res[store]; ok {
				c.order = append(c.order, store)
			}
			continue
		}
		c.order = append(c.order, store)
		res := &churnResult{Store: store}
		c.res[store] = res
		if res.Error, err = h.measureStore(ctx, "churn", store, func() error { return h.churnStore(ctx, store, res) }); err != nil {
			return err
		}
	}
	if err := h.writeChurnChart(c.chart); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c.res, "", "  ")
	if err != nil {
		return fmt.Errorf("churn results: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(c.results), 0o755); err != nil {
		return fmt.Errorf("churn results: %w", err)
	}
	return os.WriteFile(c.results, append(b, '\n'), 0o644)
}

func (h *harness) churnStore(ctx context.Context, store string, res *churnResult) error {
	c := &h.churn
	dir := filepath.Join(h.workDir, "churn", store)
	// Ten minutes of history at this write rate outgrow etcd's 2 GiB
	// default quota before kube-apiserver's compactor (which compacts one
	// interval late) first compacts; the same larger quota as the scale
	// run lets etcd finish, so that its throughput over time and its disk
	// after defrag are measured rather than an alarm.
	h.scale.etcdQuota, c.running = scaleEtcdQuota, true
	srv, err := h.startStore(ctx, store, dir)
	h.scale.etcdQuota, c.running = 0, false
	if err != nil {
		return err
	}
	defer srv.stop()
	dataDir := argValue(srv.args, "--data-dir=")
	jsonPath := filepath.Join(dir, "churn.json")
	p := h.p
	args := []string{"bench", "--endpoints=" + srv.endpoint, "--workloads=churn", "--cleanup=false",
		fmt.Sprintf("--clients=%d", p.clients), fmt.Sprintf("--connections=%d", p.connections),
		fmt.Sprintf("--key-size=%d", p.keySize), "--key-order=" + p.keyOrder, fmt.Sprintf("--value-size=%d", p.valueSize),
		fmt.Sprintf("--data-set=%d", c.keys), "--duration=" + c.duration.String(), "--compact-every=" + c.compactEvery.String(),
		"--json=" + jsonPath, "--quiet"}
	res.Commands = []string{srv.command(), "engram " + strings.Join(args, " ")}
	h.log.Info("churn", "store", store, "duration", c.duration, "keys", c.keys, "compact every", c.compactEvery)
	if res.Result, err = h.runOneWorkload(ctx, srv, args, jsonPath); err != nil {
		return err
	}
	if res.AtEnd, err = measureDisk(store, dataDir); err != nil {
		return err
	}

	// Compact everything below the current revision and wait for the
	// physical compaction: afterwards the live data is all a store needs
	// to keep, which is what the ratio is about. (kube-apiserver's own
	// compactor keeps one interval of history, which AtEnd shows.)
	if res.Keys, res.Revision, err = h.countKeys(ctx, srv.endpoint); err != nil {
		return err
	}
	res.LiveBytes = int64(c.keys) * int64(p.keySize+p.valueSize)
	start := time.Now()
	compact := []string{"--endpoints=" + srv.endpoint, "--command-timeout=30m", "compact", fmt.Sprint(res.Revision), "--physical"}
	if _, err := h.tool(ctx, h.etcdctlBin, compact...); err != nil {
		return err
	}
	res.CompactSeconds = time.Since(start).Seconds()
	res.Commands = append(res.Commands, "etcdctl "+strings.Join(compact, " "))
	if res.AfterCompact, err = measureDisk(store, dataDir); err != nil {
		return err
	}

	start = time.Now()
	switch store {
	case storeEtcd:
		defrag := []string{"--endpoints=" + srv.endpoint, "--command-timeout=30m", "defrag"}
		res.Reclaim = "`etcdctl defrag`"
		res.Commands = append(res.Commands, "etcdctl "+strings.Join(defrag, " "))
		if _, err := h.tool(ctx, h.etcdctlBin, defrag...); err != nil {
			return err
		}
	default:
		// Engram reclaims by itself (engines/badger/reclaim.go): nothing
		// to call, only to wait for.
		res.Reclaim = "Engram's own (badger: memtable flush + Flatten after large deletes)"
		if store == storePebble {
			res.Reclaim = "Engram's own (pebble's background compactions)"
		}
		if err := waitDiskSettles(ctx, store, dataDir, c.settle); err != nil {
			return err
		}
	}
	res.ReclaimSeconds = time.Since(start).Seconds()
	if res.AfterReclaim, err = measureDisk(store, dataDir); err != nil {
		return err
	}
	res.ReclaimLog = reclaimLines(srv.log)
	h.log.Info("churn done", "store", store, "live", res.LiveBytes, "at end", res.AtEnd.Total,
		"after compaction", res.AfterCompact.Total, "after reclamation", res.AfterReclaim.Total)
	return nil
}

// reclaimLines returns the lines of the server log at path that tell of
// reclaiming space (the badger adaptor logs each pass and each failure).
func reclaimLines(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "reclaim") {
			out = append(out, l)
		}
	}
	return out
}

// churnQuiet is how long the disk use must stay unchanged before Engram's
// reclamation counts as done: longer than two of badger's reclaim checks
// (one to see the deletes stop, one to start).
const churnQuiet = 30 * time.Second

// waitDiskSettles polls the data directory until its size has not changed
// for churnQuiet, or at most limit.
func waitDiskSettles(ctx context.Context, store, dir string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	last, since := int64(-1), time.Now()
	for time.Now().Before(deadline) {
		d, err := measureDisk(store, dir)
		if err != nil {
			return err
		}
		if d.Total != last {
			last, since = d.Total, time.Now()
		} else if time.Since(since) >= churnQuiet {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	return nil
}

// measureDisk sums the allocated blocks (not the apparent sizes: badger and
// etcd preallocate and map sparse files) of every file under dir.
func measureDisk(store, dir string) (diskUse, error) {
	var d diskUse
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			return nil
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no block count", path)
		}
		n := st.Blocks * 512
		d.Total += n
		if isDBFile(store, path) {
			d.DB += n
		}
		return nil
	})
	if err != nil {
		return d, fmt.Errorf("disk use of %s: %w", dir, err)
	}
	return d, nil
}

func isDBFile(store, path string) bool {
	if store == storeEtcd {
		return filepath.Base(path) == "db" && filepath.Base(filepath.Dir(path)) == "snap"
	}
	// badger's tables and value log; pebble's tables (its WAL is .log).
	ext := filepath.Ext(path)
	return ext == ".sst" || ext == ".vlog"
}

// argValue returns the value of the flag with the given "--name=" prefix.
func argValue(args []string, prefix string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, prefix); ok {
			return v
		}
	}
	return ""
}

// firstLast are the mean throughputs of the series' first and last
// minute (of its first and last third when it is shorter than three
// minutes).
func firstLast(r *result.Result) (first, last float64, window time.Duration) {
	if r == nil || len(r.Series) == 0 || r.SeriesInterval <= 0 {
		return 0, 0, 0
	}
	n := int(time.Minute.Seconds() / r.SeriesInterval)
	if 3*n > len(r.Series) {
		n = max(1, len(r.Series)/3)
	}
	mean := func(v []float64) float64 {
		var s float64
		for _, x := range v {
			s += x
		}
		return s / float64(len(v))
	}
	return mean(r.Series[:n]), mean(r.Series[len(r.Series)-n:]), time.Duration(float64(n) * r.SeriesInterval * float64(time.Second))
}

// writeChurn is the report's "Disk under churn" section.
func (h *harness) writeChurn(b *strings.Builder) {
	c := &h.churn
	if c.duration <= 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## Disk under churn\n\n")
	w("%s of updates on %d keys (`engram bench --workloads=churn`: %d clients, kube-apiserver's `Txn If mod=rev Then Put Else Get` with the revision the client last saw, a fresh random %d-byte value per write), ",
		c.duration, c.keys, h.p.clients, h.p.valueSize)
	w("while kube-apiserver's compactor runs every %s: it compacts (not physically) at the revision it saw one round earlier, so one interval of history stays. ", c.compactEvery)
	w("At the end the whole history below the current revision is compacted (`etcdctl compact --physical`), then each store reclaims the space: etcd by `etcdctl defrag`, Engram by itself (nothing is called; the harness waits until the data directory has stopped shrinking for %s). ", churnQuiet)
	w("Disk use is the allocated blocks of every file in the data directory (db: etcd's bbolt file; badger's tables and value log; the rest is etcd's WAL and snapshots, badger's memtable log and manifest). ")
	w("Live data is keys × (key size + value size) = %d × (%d + %d) bytes, what the keys and values themselves take. ", c.keys, h.p.keySize, h.p.valueSize)
	w("etcd runs with `--quota-backend-bytes=%d`: with its 2 GiB default, the history of this write rate filled it before the compactor's first compaction (at twice the interval) and every later update failed with `database space exceeded`.\n\n", int64(scaleEtcdQuota))
	w("| store | live data | at end of churn | after compaction | after reclamation (db) | reclamation took | disk / live | ≤ 2× | throughput first / last | p99 ms | max ms | errors |\n")
	w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n")
	var window time.Duration
	for _, s := range c.order {
		r := c.res[s]
		if r.Error != "" && r.AfterReclaim.Total == 0 {
			w("| %s | failed: %s | | | | | | | | | | |\n", s, oneLine(r.Error, 300))
			continue
		}
		ratio := float64(r.AfterReclaim.Total) / float64(r.LiveBytes)
		met := "met"
		if ratio > 2 {
			met = "not met"
		}
		first, last, win := firstLast(r.Result)
		window = win
		var p99, pmax float64
		var errs int64
		if r.Result != nil {
			p99, pmax, errs = r.Result.Latency.P99, r.Result.Latency.Max, r.Result.Errors
		}
		w("| %s | %s | %s | %s | %s (%s) | %s | %.2f× (db %.2f×) | %s | %s / %s ops/s (%+.0f%%) | %s | %s | %d |\n", s, mb(r.LiveBytes), mb(r.AtEnd.Total), mb(r.AfterCompact.Total),
			mb(r.AfterReclaim.Total), mb(r.AfterReclaim.DB), secs(r.ReclaimSeconds), ratio, float64(r.AfterReclaim.DB)/float64(r.LiveBytes), met,
			fnum(first), fnum(last), 100*(last/first-1), fms(p99), fms(pmax), errs)
	}
	w("\nThroughput first / last is the mean of the first and the last %s of the per-second series; p99 and max are over every update of the run, ", window)
	w("reclamations and compactions included. Reclamation: ")
	for i, s := range c.order {
		if i > 0 {
			w("; ")
		}
		w("%s: %s", s, c.res[s].Reclaim)
	}
	w(".\n\n")
	for _, s := range c.order {
		if r := c.res[s]; len(r.ReclaimLog) > 0 {
			w("%s's reclamations, from its log (the run, the compaction at the end and the wait after it):\n\n```\n%s\n```\n\n", s, strings.Join(r.ReclaimLog, "\n"))
		}
	}
	w("![throughput over time under churn](%s)\n\n", h.relToReport(c.chart))
	w("Compactions by the churn's compactor (revision, second of the run):")
	for _, s := range c.order {
		if r := c.res[s]; r.Result != nil {
			w(" %s:", s)
			for _, cp := range r.Result.Compactions {
				w(" %d at %.0f s", cp.Revision, cp.At)
			}
			if len(r.Result.Compactions) == 0 {
				w(" none")
			}
			w(" (end revision %d);", r.Revision)
		}
	}
	w(" kube-apiserver's compactor only records a revision in its first round, so a run of two intervals compacts at most once, at its very end, and may end first; the compaction at the end then removes the whole history.\n")
	writeErrorsAndCommands(b, c.order, "updates", func(s string) (*result.Result, []string) { return c.res[s].Result, c.res[s].Commands })
	w("```\n\nRaw results: [`%s`](%s).\n", h.relToReport(c.results), h.relToReport(c.results))
}

// mb formats bytes in decimal megabytes, the unit of the live data figure.
func mb(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }
