package main

// Cost curves: how each cost of a store grows with the
// data it holds. One fresh server per store is grown step by step to each
// scale point (--scale, e.g. 10k, 100k, 1M, 5M objects) and measured there:
// get and create throughput, one full paginated list of a prefix of
// 100,000 keys (time and the server's peak RSS meanwhile), watch p99 with
// 100, 1,000 and 10,000 watchers, RSS and disk bytes per object, and the
// time from kill -9 to serving a Range again. The report section and the
// growth classification are in scalereport.go, the chart in scalechart.go.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/engramkv/engram/bench/result"
)

const (
	// scalePrefix holds every object of the scale run, in sub-prefixes of
	// scaleListKeys objects each (engram bench --prefix-objects), as
	// kube-apiserver keeps each resource type under its own prefix. The
	// first sub-prefix is the one listed.
	scalePrefix   = "/scale/"
	scaleListKeys = 100_000
	// scaleEvents bounds the events per second delivered in the watch
	// measurements (write rate × watchers), so that the p99 at 10,000
	// watchers measures the fan-out and not a backlog that grows for the
	// whole run.
	scaleEvents = 20_000
	// scaleEtcdQuota is etcd's --quota-backend-bytes for the scale run: its
	// default of 2 GiB holds about 2.5 million objects of 512 bytes.
	scaleEtcdQuota = 16 << 30
)

// scaleWatchers are the watcher counts measured at every point.
var scaleWatchers = []int{100, 1_000, 10_000}

// scaleRun is the configuration and the results of the scale measurements.
type scaleRun struct {
	points, stores string        // flags, parsed by runScale
	from           string        // --scale-from: a scale.json to report instead of measuring
	duration       time.Duration // of get, create and each watch run
	etcdQuota      int64         // etcd's --quota-backend-bytes while > 0 (servers.go)
	startTimeout   time.Duration // tryStart's wait for readiness while > 0 (servers.go)

	// Mode, Started and the versions say which run measured the figures,
	// since the section may be reported again (--scale-from) elsewhere.
	Mode            string             `json:"mode"`
	Started         time.Time          `json:"started"`
	Engram          string             `json:"engram_version"`
	Etcd            string             `json:"etcd_version"`
	DurationSeconds float64            `json:"duration_seconds"` // --scale-duration
	Points          []int              `json:"points"`
	Stores          []string           `json:"stores"`
	Results         []scalePoint       `json:"results"`
	Took            map[string]float64 `json:"took_seconds"` // store -> seconds of its whole scale run
	Failed          map[string]string  `json:"failed,omitempty"`
	Load            map[string]string  `json:"load_average,omitempty"` // store -> load average when its run started
	Commands        []string           `json:"commands,omitempty"`     // examples of the engram bench commands run
}

// scalePoint is one store measured at one number of objects.
type scalePoint struct {
	Store   string `json:"store"`
	Objects int    `json:"objects"`
	// Keys is what the server holds when measured (etcdctl count): the
	// loaded objects plus nothing else, or an error shows.
	Keys        int64   `json:"keys"`
	LoadSeconds float64 `json:"load_seconds"` // loading the difference to the previous point
	LoadRate    float64 `json:"load_objects_per_sec"`

	RSS          memory `json:"rss"` // settled, before any measurement at this point
	DiskBytes    int64  `json:"disk_bytes"`
	DiskApparent int64  `json:"disk_apparent_bytes"`

	Get    scaleOp `json:"get"`
	Create scaleOp `json:"create"`

	ListKeys      int     `json:"list_keys"`
	ListMillis    float64 `json:"list_ms"` // median full list
	Lists         int64   `json:"lists"`
	ListRSSBefore int64   `json:"list_rss_before"`
	ListRSSPeak   int64   `json:"list_rss_peak"`
	ListError     string  `json:"list_error,omitempty"`

	Watch []scaleWatch `json:"watch"`

	// Recovery holds the seconds from kill -9 to the first Range answered
	// by the restarted server, once per restart.
	Recovery      []float64 `json:"recovery_seconds"`
	RecoveryError string    `json:"recovery_error,omitempty"`
	// RecoveryAtLeast is how long a restart that never served ran: a
	// lower bound of the recovery time.
	RecoveryAtLeast float64 `json:"recovery_at_least_seconds,omitempty"`
	Error           string  `json:"error,omitempty"`
}

// scaleOp is a throughput measurement.
type scaleOp struct {
	Throughput float64 `json:"ops_per_sec"`
	P99        float64 `json:"p99_ms"`
	Errors     int64   `json:"errors"`
	Error      string  `json:"error,omitempty"`
}

// scaleWatch is one watch measurement.
type scaleWatch struct {
	Watchers  int     `json:"watchers"`
	Rate      float64 `json:"writes_per_sec"`
	P99       float64 `json:"p99_ms"`
	Expected  int64   `json:"expected"`
	Received  int64   `json:"received"`
	Delivered float64 `json:"delivered"`
	Error     string  `json:"error,omitempty"`
}

// registerScaleFlags adds the scale flags to the command line.
func (h *harness) registerScaleFlags() {
	h.scale.stores = storeEtcd + "," + storeBadger
	// Parsed as they are given, so a typo stops the harness before the
	// other measurements rather than after them.
	flag.Func("scale", "comma-separated object counts for the cost curves, e.g. 10000,100000,1000000,5000000 (empty: none)", func(v string) error {
		_, _, err := parseScale(v, h.scale.stores)
		h.scale.points = v
		return err
	})
	flag.Func("scale-stores", "stores measured at each --scale point (default "+h.scale.stores+")", func(v string) error {
		_, _, err := parseScale("", v)
		h.scale.stores = v
		return err
	})
	flag.DurationVar(&h.scale.duration, "scale-duration", 3*time.Second, "length of the get, create and each watch run at a --scale point")
	flag.StringVar(&h.scale.from, "scale-from", "", "write the cost curves from this scale.json of an earlier run instead of measuring (--scale is then ignored)")
}

// parseScale parses the flags; it returns no points when --scale is empty.
func parseScale(points, stores string) ([]int, []string, error) {
	var ns []int
	for _, f := range strings.Split(points, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(strings.ReplaceAll(f, "_", ""))
		if err != nil || n < 1 {
			return nil, nil, fmt.Errorf("--scale: %q is not a positive object count", f)
		}
		ns = append(ns, n)
	}
	slices.Sort(ns)
	ns = slices.Compact(ns)
	var ss []string
	for _, s := range strings.Split(stores, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if _, ok := storeInfo[s]; !ok || s == storeCeiling {
			return nil, nil, fmt.Errorf("--scale-stores: %q is not a store that keeps data", s)
		}
		ss = append(ss, s)
	}
	if len(ns) > 0 && len(ss) == 0 {
		return nil, nil, fmt.Errorf("--scale-stores is empty")
	}
	return ns, ss, nil
}

// scaleJSONPath and scaleChartPath sit next to --results and --chart.
func (h *harness) scaleJSONPath() string {
	return filepath.Join(filepath.Dir(h.outJSON), "scale.json")
}

func (h *harness) scaleChartPath() string {
	return filepath.Join(filepath.Dir(h.outChart), "scale.png")
}

// runScale measures every --scale-stores store at every --scale point and
// writes the raw results. A store that fails keeps the points it reached.
func (h *harness) runScale(ctx context.Context) error {
	if h.scale.from != "" {
		// Reporting again, e.g. after a change of the report's wording,
		// must not cost another 25 minutes of measurements.
		b, err := os.ReadFile(h.scale.from)
		if err != nil {
			return fmt.Errorf("--scale-from: %w", err)
		}
		if err := json.Unmarshal(b, &h.scale); err != nil {
			return fmt.Errorf("--scale-from %s: %w", h.scale.from, err)
		}
		if h.scale.DurationSeconds > 0 {
			h.scale.duration = time.Duration(h.scale.DurationSeconds * float64(time.Second))
		}
		return nil
	}
	var err error
	if h.scale.Points, h.scale.Stores, err = parseScale(h.scale.points, h.scale.stores); err != nil {
		return err
	}
	if len(h.scale.Points) == 0 {
		return nil
	}
	h.scale.Took = map[string]float64{}
	h.scale.DurationSeconds = h.scale.duration.Seconds()
	h.scale.Mode, h.scale.Started = h.mode, time.Now().UTC()
	h.scale.Engram, h.scale.Etcd = oneLine(h.versions["engram"], 200), oneLine(h.versions["etcd"], 200)
	h.scale.Failed = map[string]string{}
	h.scale.Load = map[string]string{}
	// Only for this run: the other measurements keep etcd's defaults.
	h.scale.etcdQuota = scaleEtcdQuota
	defer func() { h.scale.etcdQuota = 0 }()
	for _, store := range h.scale.Stores {
		if why, skip := h.skipped[store]; skip {
			h.scale.Failed[store] = "skipped: " + why
			continue
		}
		start := time.Now()
		h.scale.Load[store] = loadavg()
		err := h.scaleStore(ctx, store)
		h.scale.Took[store] = time.Since(start).Seconds()
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			h.log.Error("scale run failed", "store", store, "err", err)
			h.scale.Failed[store] = err.Error()
		}
		if err := h.writeScaleJSON(); err != nil {
			return err
		}
	}
	return nil
}

func (h *harness) writeScaleJSON() error {
	path := h.scaleJSONPath()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("scale results dir: %w", err)
	}
	b, err := json.MarshalIndent(&h.scale, "", "  ")
	if err != nil {
		return fmt.Errorf("scale results: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("scale results: %w", err)
	}
	return nil
}

// scaleStore grows one server through every point. Its data directory is
// removed afterwards: at 5 million objects it holds several gigabytes.
func (h *harness) scaleStore(ctx context.Context, store string) error {
	dir := filepath.Join(h.workDir, "scale", store)
	defer os.RemoveAll(dir)
	srv, err := h.startStore(ctx, store, dir)
	if err != nil {
		return err
	}
	// srv changes with every restart; stop whichever runs at the end.
	defer func() { srv.stop() }()
	loaded := 0
	for _, n := range h.scale.Points {
		pt := scalePoint{Store: store, Objects: n}
		var perr error
		srv, perr = h.scalePoint(ctx, srv, &pt, loaded)
		h.scale.Results = append(h.scale.Results, pt)
		if perr != nil {
			return fmt.Errorf("at %d objects: %w", n, perr)
		}
		loaded = n
		if err := h.writeScaleJSON(); err != nil {
			return err
		}
	}
	return nil
}

// scalePoint loads objects loaded..pt.Objects-1 into srv and measures it. It
// returns the server that runs afterwards (the recovery measurement
// replaces it) and an error only when the server can no longer be used.
func (h *harness) scalePoint(ctx context.Context, srv *server, pt *scalePoint, loaded int) (*server, error) {
	n := pt.Objects
	h.log.Info("scale: loading", "store", pt.Store, "from", loaded, "to", n)
	start := time.Now()
	if _, err := h.scaleBench(ctx, srv, "load", fmt.Sprintf("--load-from=%d", loaded), fmt.Sprintf("--data-set=%d", n),
		fmt.Sprintf("--load-batch=%d", h.p.rssBatch), "--duration=2h"); err != nil {
		pt.Error = "load: " + err.Error()
		return srv, err
	}
	pt.LoadSeconds = time.Since(start).Seconds()
	pt.LoadRate = float64(n-loaded) / pt.LoadSeconds
	// Background work the load started (flushes, compactions) settles
	// before the figures that stay are read.
	time.Sleep(3 * time.Second)
	var err error
	if pt.RSS, err = srv.memory(); err != nil {
		return srv, err
	}
	dataDir := filepath.Join(filepath.Dir(srv.log), "data")
	if pt.DiskBytes, pt.DiskApparent, err = diskUsage(dataDir); err != nil {
		return srv, err
	}
	if pt.Keys, _, err = h.countKeys(ctx, srv.endpoint); err != nil {
		// etcdctl missing or the count failed: the figures stand without it.
		h.log.Warn("scale: counting keys", "err", err)
	}
	h.log.Info("scale: loaded", "store", pt.Store, "objects", n, "took", time.Since(start).Round(time.Millisecond),
		"RSS", mib(pt.RSS.RSS), "disk", mib(pt.DiskBytes))

	dur := "--duration=" + h.scale.duration.String()
	// get: random objects among all loaded, read where the load left them.
	if r, err := h.scaleBench(ctx, srv, "get", "--existing", fmt.Sprintf("--data-set=%d", n), "--cleanup=false", dur); err != nil {
		pt.Get.Error = err.Error()
	} else {
		pt.Get = scaleOp{Throughput: r.Throughput, P99: r.Latency.P99, Errors: r.Errors}
	}

	// One full list at a time (kube-apiserver's reflector), as many as fit
	// in 2 s (at least one), while the server's RSS is sampled.
	pt.ListKeys = min(n, scaleListKeys)
	before, _ := srv.memory()
	pt.ListRSSBefore = before.RSS
	stop := sampleRSS(srv.cmd.Process.Pid, 20*time.Millisecond)
	r, err := h.scaleBench(ctx, srv, "list", "--existing", fmt.Sprintf("--data-set=%d", pt.ListKeys), "--list-clients=1",
		"--list-limit=500", "--cleanup=false", "--duration=2s")
	pt.ListRSSPeak = stop().RSS
	if err != nil {
		pt.ListError = err.Error()
	} else {
		pt.ListMillis, pt.Lists = r.Latency.P50, r.Ops
		if r.Errors > 0 {
			pt.ListError = fmt.Sprintf("%d lists failed: %s", r.Errors, strings.Join(r.ErrorSamples, "; "))
		}
	}

	// create: fresh keys under their own prefix, deleted afterwards and
	// compacted (engram bench --cleanup), as kube-apiserver's compactor
	// would; the compaction also covers the load's history.
	if r, err := h.scaleBench(ctx, srv, "create", dur); err != nil {
		pt.Create.Error = err.Error()
	} else {
		pt.Create = scaleOp{Throughput: r.Throughput, P99: r.Latency.P99, Errors: r.Errors}
	}

	for _, w := range scaleWatchers {
		rate := float64(scaleEvents) / float64(w)
		sw := scaleWatch{Watchers: w, Rate: rate}
		r, err := h.scaleBench(ctx, srv, "watch", fmt.Sprintf("--watchers=%d", w), fmt.Sprintf("--watch-rate=%g", rate), dur)
		switch {
		case err != nil:
			sw.Error = err.Error()
		case r.Watch == nil:
			sw.Error = "no watch statistics in the report"
		default:
			sw.P99, sw.Expected, sw.Received, sw.Delivered = r.Latency.P99, r.Watch.Expected, r.Watch.Received, r.Watch.Delivered()
		}
		pt.Watch = append(pt.Watch, sw)
	}

	// Recovery last: it replaces the server. Repeated while it is cheap.
	for i := 0; i < 3; i++ {
		secs, next, err := h.killAndRecover(ctx, srv)
		if next != nil {
			srv = next
		}
		if err != nil {
			pt.RecoveryError = err.Error()
			pt.RecoveryAtLeast = secs
			return srv, err
		}
		pt.Recovery = append(pt.Recovery, secs)
		h.log.Info("scale: recovered", "store", pt.Store, "objects", n, "seconds", secs)
		if secs > 5 {
			break
		}
	}
	return srv, nil
}

// scaleBench runs one engram bench workload against srv with the scale
// layout and returns its result.
func (h *harness) scaleBench(ctx context.Context, srv *server, workload string, extra ...string) (*resultT, error) {
	jsonPath := filepath.Join(filepath.Dir(srv.log), "scale-"+workload+".json")
	_ = os.Remove(jsonPath)
	args := []string{"bench", "--endpoints=" + srv.endpoint, "--workloads=" + workload, "--prefix=" + scalePrefix,
		fmt.Sprintf("--prefix-objects=%d", scaleListKeys),
		fmt.Sprintf("--clients=%d", h.p.clients), fmt.Sprintf("--connections=%d", h.p.connections),
		fmt.Sprintf("--key-size=%d", h.p.keySize), "--key-order=" + h.p.keyOrder, fmt.Sprintf("--value-size=%d", h.p.valueSize)}
	args = append(args, extra...)
	args = append(args, "--json="+jsonPath, "--quiet")
	if len(h.scale.Commands) < 8 && !slices.ContainsFunc(h.scale.Commands, func(c string) bool { return strings.Contains(c, "--workloads="+workload+" ") }) {
		h.scale.Commands = append(h.scale.Commands, "engram "+strings.Join(args, " "))
	}
	cmd := exec.CommandContext(ctx, h.engramBin, args...)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	runErr := cmd.Run()
	rep, err := result.ReadJSON(jsonPath)
	if runErr != nil {
		return nil, fmt.Errorf("engram bench %s: %w: %s", workload, runErr, oneLine(stderr.String(), 400))
	}
	if err != nil {
		return nil, fmt.Errorf("engram bench %s: %w", workload, err)
	}
	if len(rep.Results) == 0 {
		return nil, fmt.Errorf("engram bench %s: no result", workload)
	}
	return &rep.Results[0], nil
}

// killAndRecover kills srv with SIGKILL, starts the same store on the same
// data and returns the seconds from the kill until a Range is answered.
func (h *harness) killAndRecover(ctx context.Context, srv *server) (float64, *server, error) {
	dir := filepath.Dir(srv.log)
	start := time.Now()
	if err := srv.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return 0, nil, fmt.Errorf("kill -9: %w", err)
	}
	<-srv.exited
	h.scale.startTimeout = 10 * time.Minute
	next, err := h.startOn(ctx, srv.name, dir)
	h.scale.startTimeout = 0
	if err != nil {
		return time.Since(start).Seconds(), nil, fmt.Errorf("restart after kill -9: %w", err)
	}
	// Ready (etcd /health, Engram /readyz) is not the same as serving:
	// the time ends at the first Range answered.
	for {
		if _, err := h.tool(ctx, h.etcdctlBin, "--endpoints="+next.endpoint, "--dial-timeout=1s", "--command-timeout=2s",
			"get", scalePrefix, "--limit=1", "--keys-only"); err == nil {
			break
		} else if time.Since(start) > 10*time.Minute {
			return 0, next, fmt.Errorf("no Range answered 10 minutes after kill -9: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start).Seconds(), next, nil
}

// diskUsage walks dir as du does: allocated bytes (blocks, what the disk
// holds; sparse preallocated files count what they use) and apparent sizes.
func diskUsage(dir string) (allocated, apparent int64, err error) {
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed meanwhile by the store (compaction)
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			allocated += st.Blocks * 512
		}
		if info.Mode().IsRegular() {
			apparent += info.Size()
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("disk usage of %s: %w", dir, err)
	}
	return allocated, apparent, nil
}

// scalePointsOf returns a store's results in object order.
func (s *scaleRun) pointsOf(store string) []scalePoint {
	var out []scalePoint
	for _, p := range s.Results {
		if p.Store == store {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Objects < out[j].Objects })
	return out
}
