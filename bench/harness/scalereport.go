package main

import (
	"fmt"
	"math"
	"strings"
)

// Growth classes of a cost as the data grows.
const (
	growthFlat        = "flat"
	growthLog         = "logarithmic"
	growthLinear      = "linear"
	growthSuperlinear = "faster than linear"
	growthFalls       = "falling"
	growthUnknown     = "unknown"
)

// flatTolerance is the relative change over the whole range of points below
// which a cost counts as flat: repeated 3-second runs on a shared 2-core
// machine move by that much without any change in the data.
const flatTolerance = 0.25

// minLinearExponent is the least log-log slope called linear.
const minLinearExponent = 0.4

// growth is how a cost y grew over object counts n.
type growth struct {
	Class string
	// Ratio is y at the largest n over y at the smallest; Exponent the
	// least-squares slope of log y over log n (1: linear, 0: flat).
	Ratio, Exponent float64
	From, To        int
}

// classify fits the measured costs. With three or more points it picks
// between y = a + b·ln n and y = a + b·n by the smaller squared error; with
// two, where both fit exactly, by the exponent (a logarithmic cost grows far
// less than n over a decade, a linear one about as much). Points with a
// missing (NaN) or non-positive cost are left out.
func classify(ns []int, ys []float64) growth {
	var xs, vs []float64
	g := growth{Class: growthUnknown}
	for i, n := range ns {
		if i < len(ys) && !math.IsNaN(ys[i]) && ys[i] > 0 && n > 0 {
			xs, vs = append(xs, float64(n)), append(vs, ys[i])
			if g.From == 0 {
				g.From = n
			}
			g.To = n
		}
	}
	if len(xs) < 2 || xs[0] == xs[len(xs)-1] {
		return g
	}
	lx, ly := make([]float64, len(xs)), make([]float64, len(xs))
	for i := range xs {
		lx[i], ly[i] = math.Log(xs[i]), math.Log(vs[i])
	}
	g.Exponent, _, _ = fitLine(lx, ly)
	first, last := vs[0], vs[len(vs)-1]
	g.Ratio = last / first
	rel := (last - first) / first
	switch {
	case math.Abs(rel) < flatTolerance:
		g.Class = growthFlat
	case rel < 0:
		g.Class = growthFalls
	case g.Exponent > 1.25:
		g.Class = growthSuperlinear
	case len(xs) == 2:
		if g.Exponent >= 0.6 {
			g.Class = growthLinear
		} else {
			g.Class = growthLog
		}
	default:
		_, _, sseLog := fitLine(lx, vs)
		_, _, sseLin := fitLine(xs, vs)
		// An affine fit can win on a cost that grew by half over 50 times
		// the data; its marginal part is then small beside its fixed
		// part, and "linear" would mislead: below minLinearExponent the
		// cost grows far slower than the data.
		if sseLin <= sseLog && g.Exponent >= minLinearExponent {
			g.Class = growthLinear
		} else {
			g.Class = growthLog
		}
	}
	return g
}

// fitLine is the least-squares line y = a + b·x and its squared error.
func fitLine(xs, ys []float64) (b, a, sse float64) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0, sy / n, 0
	}
	b = (n*sxy - sx*sy) / den
	a = (sy - b*sx) / n
	for i := range xs {
		d := ys[i] - (a + b*xs[i])
		sse += d * d
	}
	return b, a, sse
}

// describe is the measured half of a growth sentence.
func (g growth) describe() string {
	if g.Class == growthUnknown {
		return "not enough measured points to tell"
	}
	return fmt.Sprintf("%s (×%.2f from %s to %s objects, log-log slope %.2f)", g.Class, g.Ratio, objects(g.From), objects(g.To), g.Exponent)
}

// objects formats an object count as 10k, 1M, 2.5M.
func objects(n int) string {
	switch {
	case n >= 1_000_000 && n%100_000 == 0:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/1e6), ".0") + "M"
	case n >= 1000 && n%100 == 0:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/1e3), ".0") + "k"
	}
	return fmt.Sprint(n)
}

// scaleMetric is one cost of the cost curves: how to read it from a point,
// how to show it, and what each store's structure lets one expect.
type scaleMetric struct {
	key, title, unit string
	// value is the number in the table; cost the number classified (a
	// throughput's cost is its inverse, the time per operation).
	value, cost func(scalePoint) float64
	format      func(float64) string
	// expect is the class each store's structure predicts ("" when it
	// predicts none), why the mechanism behind it.
	expect, why map[string]string
	// floor is the smallest cost the measurement resolves; smaller costs
	// are raised to it before classifying, since a ratio to a near-zero
	// point says nothing (a list that added 1 byte of RSS at one point
	// made the next one "×5e8, faster than linear").
	floor float64
}

func nan() float64 { return math.NaN() }

func perSecond(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return nan()
	}
	return 1e6 / v // µs per operation
}

func orNaN(v float64, bad bool) float64 {
	if bad || v <= 0 {
		return nan()
	}
	return v
}

func median64(v []float64) float64 {
	if len(v) == 0 {
		return nan()
	}
	s := append([]float64(nil), v...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fbytes(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v >= 1<<30:
		return fmt.Sprintf("%.2f GiB", v/(1<<30))
	case v >= 1<<20:
		return fmt.Sprintf("%.0f MiB", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.0f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}

func fsecs(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.2f s", v)
}

// watchAt is the watch measurement of w watchers at a point.
func watchAt(p scalePoint, w int) (scaleWatch, bool) {
	for _, sw := range p.Watch {
		if sw.Watchers == w {
			return sw, sw.Error == "" && sw.Expected > 0
		}
	}
	return scaleWatch{}, false
}

// listRSS is the memory one full list added to the server, at least a byte
// so that the log scales can show "nothing".
func listRSS(p scalePoint) float64 {
	if p.ListError != "" || p.ListRSSPeak == 0 {
		return nan()
	}
	return float64(max(p.ListRSSPeak-p.ListRSSBefore, 1))
}

// throughputMetric is the metric of an operation measured by its throughput,
// which both stores' structures predict to cost log N per operation; why
// says how, store by store.
func throughputMetric(op string, measured func(scalePoint) scaleOp, why map[string]string) scaleMetric {
	throughput := func(p scalePoint) float64 {
		m := measured(p)
		return orNaN(m.Throughput, m.Error != "")
	}
	return scaleMetric{key: op, title: op + " throughput", unit: "ops/s (cost: µs per " + op + ")",
		value:  throughput,
		cost:   func(p scalePoint) float64 { return perSecond(throughput(p)) },
		format: fnum,
		expect: map[string]string{storeEtcd: growthLog, storeBadger: growthLog},
		why:    why,
	}
}

func scaleMetrics() []scaleMetric {
	ms := []scaleMetric{
		throughputMetric("get", func(p scalePoint) scaleOp { return p.Get }, map[string]string{
			storeEtcd:   "a get walks etcd's in-memory treeIndex (a B-tree, depth log N) and then bbolt's B+tree (log N pages, read from the page cache while the file fits in memory)",
			storeBadger: "a get hits Engram's latest-record LRU (bounded, so its hit rate falls as N grows) or searches badger's memtables and LSM levels (one more level per tenfold data, bloom filters skip most tables), so its cost grows with the number of levels",
		}),
		throughputMetric("create", func(p scalePoint) scaleOp { return p.Create }, map[string]string{
			storeEtcd:   "a create checks the key in treeIndex, inserts into bbolt's B+tree (copying the log N pages of its path at commit) and waits for an fsync whose cost does not depend on N",
			storeBadger: "a create looks the key up (absent: bloom filters answer for most levels), appends to badger's memtable and write-ahead log (independent of N) and waits for the fsync; background compaction per write grows with the number of levels",
		}),
		{key: "list", title: "full list of a 100,000-key prefix (limit 500)", unit: "ms per full list, median",
			value: func(p scalePoint) float64 { return orNaN(p.ListMillis, p.ListError != "") },
			cost: func(p scalePoint) float64 {
				return orNaN(p.ListMillis, p.ListError != "" || p.ListKeys < scaleListKeys)
			},
			format: fms,
			expect: map[string]string{storeEtcd: growthFlat, storeBadger: growthFlat},
			why: map[string]string{
				storeEtcd:   "a list of k keys walks k entries of treeIndex and reads k values from bbolt, plus a seek of depth log N per page: the k keys dominate, the rest of the data is not visited",
				storeBadger: "a list iterates one key range: a merge over the memtables and the tables of each level that overlap the range, so k keys plus a seek per level and page; the rest of the data is not visited",
			}},
		{key: "listrss", title: "server memory added by one full list", unit: "peak VmRSS during the list minus VmRSS before",
			value: listRSS,
			cost: func(p scalePoint) float64 {
				if p.ListKeys < scaleListKeys {
					return nan()
				}
				return listRSS(p)
			},
			format: fbytes,
			// VmRSS sampled every 20 ms moves by a few MiB with no list
			// running (heap growth, page cache of mapped files).
			floor:  4 << 20,
			expect: map[string]string{storeEtcd: growthFlat, storeBadger: growthFlat},
			why: map[string]string{
				storeEtcd:   "pages of 500 are read and sent one at a time, so what a list holds at once depends on the page, not on N (bbolt's file pages the list touches are mapped and count in VmRSS too)",
				storeBadger: "pages of 500 are read and sent one at a time; Engram's count cache keeps the revision keys of the listed range between pages (proportional to the 100,000 listed keys, not to N)",
			}},
	}
	for _, w := range scaleWatchers {
		ms = append(ms, scaleMetric{key: fmt.Sprintf("watch%d", w), title: fmt.Sprintf("watch p99 with %s watchers", objects(w)),
			unit: fmt.Sprintf("ms from the start of a write to its receipt (%g writes/s)", float64(scaleEvents)/float64(w)),
			value: func(p scalePoint) float64 {
				sw, ok := watchAt(p, w)
				return orNaN(sw.P99, !ok)
			},
			format: fms,
			expect: map[string]string{storeEtcd: growthFlat, storeBadger: growthFlat},
			why: map[string]string{
				storeEtcd:   "an event is handed from the write path to every synced watcher of its range; the stored data is not read",
				storeBadger: "an event is handed from the write path to every watcher of its range; the stored data is not read",
			}})
	}
	ms = append(ms,
		scaleMetric{key: "rss", title: "server RSS", unit: "VmRSS after the load settled (bytes per object in brackets, and the anonymous part: the rest is file-backed, mapped files)",
			value:  func(p scalePoint) float64 { return orNaN(float64(p.RSS.RSS), false) },
			format: fbytes,
			expect: map[string]string{storeEtcd: growthLinear},
			why: map[string]string{
				storeEtcd:   "etcd keeps every key with its revisions in treeIndex in memory, and bbolt's file is memory-mapped, so the pages written or read stay in VmRSS",
				storeBadger: "Engram's caches (latest-record LRU, count cache) and badger's memtables and block cache are bounded (about 0.4 GiB at the defaults); what grows with N is the index and bloom filter badger keeps for each table, and the pages of the table files it memory-maps, which count in VmRSS as file-backed (reclaimable) pages",
			}},
		scaleMetric{key: "disk", title: "disk", unit: "bytes allocated in the data directory (bytes per object in brackets)",
			value:  func(p scalePoint) float64 { return orNaN(float64(p.DiskBytes), false) },
			format: fbytes,
			expect: map[string]string{storeEtcd: growthLinear, storeBadger: growthLinear},
			why: map[string]string{
				storeEtcd:   "each object is one bbolt entry (key revision + key-value record); the WAL and snapshots add a bounded amount",
				storeBadger: "each object is one record in badger's tables (small values are kept in the LSM), plus the write-ahead log of the memtables and versions not yet compacted away",
			}},
		scaleMetric{key: "recovery", title: "kill -9 to serving again", unit: "seconds from SIGKILL to the first Range answered by the restarted server, median",
			value:  func(p scalePoint) float64 { return orNaN(median64(p.Recovery), p.RecoveryError != "") },
			format: fsecs,
			expect: map[string]string{storeEtcd: growthLinear, storeBadger: growthFlat},
			why: map[string]string{
				storeEtcd:   "on start etcd rebuilds treeIndex by reading every key revision from bbolt, and replays the WAL since its last snapshot",
				storeBadger: "badger opens its manifest and replays only the memtables' write-ahead log, and Engram recovers its revision from the store without scanning the keys",
			}},
	)
	for i := range ms {
		if ms[i].cost == nil {
			ms[i].cost = ms[i].value
		}
	}
	return ms
}

// growthSentence says how one store's cost grew and whether that is what
// its structure predicts.
func growthSentence(m scaleMetric, store string, g growth) string {
	s := fmt.Sprintf("**%s**: %s", store, g.describe())
	why := m.why[store]
	switch exp := m.expect[store]; {
	case g.Class == growthUnknown:
		return s + "."
	case exp == "" && why != "":
		return s + ". Structure: " + why + "."
	case exp == g.Class:
		return s + ", as its structure predicts: " + why + "."
	case why != "":
		return s + fmt.Sprintf(". Its structure alone predicts %s (%s); over these points something else dominated (caches, background work or noise of a shared machine).", exp, why)
	}
	return s + "."
}

// writeScale writes the "Cost curves" section and its chart.
func (h *harness) writeScale(b *strings.Builder) error {
	sc := &h.scale
	if len(sc.Points) == 0 {
		return nil
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	chart := h.scaleChartPath()
	metrics := scaleMetrics()
	if err := h.writeScaleChart(chart, metrics); err != nil {
		return err
	}
	w("\n## Cost curves\n\n")
	if sc.Mode != "" {
		w("Measured by `%s` on %s (engram: %s; etcd: %s), apart from the other sections' run.\n\n",
			sc.Mode, sc.Started.Format("2006-01-02 15:04 MST"), sc.Engram, sc.Etcd)
	}
	w("One fresh server per store is grown to %s objects in turn (`engram bench --workloads=load --load-batch=%d` loads only the difference: create transactions of %d objects, %d-byte keys in %s order, %d-byte values), ",
		joinObjects(sc.Points), h.p.rssBatch, h.p.rssBatch, h.p.keySize, h.p.keyOrder, h.p.valueSize)
	w("spread over prefixes of %s objects each (`--prefix-objects`, as kube-apiserver keeps each resource type under its own prefix; the objects of one prefix are loaded in random order, the prefixes one after the other). At each point, in this order: ", fnum(scaleListKeys))
	w("3 s of settling, then VmRSS and the data directory's allocated bytes; get for %s on random objects among all loaded (`--existing`, %d clients); ", sc.duration, h.p.clients)
	w("full paginated lists (limit 500, one at a time, for 2 s, at least one) of the first prefix, while the server's VmRSS is sampled every 20 ms; ")
	w("create for %s on fresh keys, which are then deleted and the store compacted physically (as kube-apiserver's compactor would; this also compacts the load's history); ", sc.duration)
	w("watch with %s watchers for %s each, the write rate scaled so that %s events/s are delivered (every event must arrive); ", joinInts(scaleWatchers), sc.duration, objects(scaleEvents))
	w("then kill -9 and a restart on the same data, timed until a Range is answered (`etcdctl get`, polled every 20 ms), repeated up to 3 times while a recovery takes under 5 s. ")
	w("etcd runs with `--quota-backend-bytes=%d` (its 2 GiB default holds about 2.5 million such objects). ", int64(scaleEtcdQuota))
	if len(sc.Points) > 0 && sc.Points[0] < scaleListKeys {
		w("Below %s objects the listed prefix holds all of them (%s at %s), so those list figures (in italics) list fewer keys and are left out of the list fits. ",
			objects(scaleListKeys), objects(sc.Points[0]), objects(sc.Points[0]))
	}
	w("Raw results: [`%s`](%s).\n\n", h.relToReport(h.scaleJSONPath()), h.relToReport(h.scaleJSONPath()))
	w("How each cost grows is classified from the measured points alone: flat when the cost at the largest point is within %.0f%% of the smallest; ", 100*flatTolerance)
	w("otherwise logarithmic or linear by the better least-squares fit of cost = a + b·ln N against cost = a + b·N, linear only with a log-log slope of at least %.1f (with two points: log-log slope below 0.6 is logarithmic); ", minLinearExponent)
	w("throughputs are classified by their inverse, the time per operation. The mechanism named after each is what the store's structure predicts, and the sentence says when the measurement disagrees with it.\n\n")
	w("![cost curves](%s)\n\n", h.relToReport(chart))
	var took []string
	for _, s := range sc.Stores {
		if t, ok := sc.Took[s]; ok {
			took = append(took, fmt.Sprintf("%s %s", s, secs(t)))
		}
	}
	if len(took) > 0 {
		w("Time of the scale run per store: %s.", strings.Join(took, ", "))
		var loads []string
		for _, s := range sc.Stores {
			if l, ok := sc.Load[s]; ok {
				loads = append(loads, fmt.Sprintf("%s %s", s, l))
			}
		}
		if len(loads) > 0 {
			w(" Load average when each store's run started: %s (%d CPUs; a figure near or above the CPU count means other processes shared the machine and single 3-second figures can move by tens of percent).", strings.Join(loads, ", "), h.machine.CPUs)
		}
		w("\n\n")
	}
	for _, s := range sc.Stores {
		if why := sc.Failed[s]; why != "" {
			w("- **%s** did not reach every point: %s\n", s, oneLine(why, 500))
		}
	}
	if len(sc.Failed) > 0 {
		w("\n")
	}

	for _, m := range metrics {
		w("### %s\n\n%s.\n\n", upperFirst(m.title), upperFirst(m.unit))
		w("| store |")
		for _, n := range sc.Points {
			w(" %s |", objects(n))
		}
		w("\n| --- |%s\n", strings.Repeat(" ---: |", len(sc.Points)))
		for _, s := range sc.Stores {
			pts := sc.pointsOf(s)
			w("| %s |", s)
			for _, n := range sc.Points {
				cell := "–"
				for _, p := range pts {
					if p.Objects == n {
						cell = h.scaleCell(m, p)
					}
				}
				w(" %s |", cell)
			}
			w("\n")
		}
		w("\n")
		for _, s := range sc.Stores {
			pts := sc.pointsOf(s)
			var ns []int
			var ys []float64
			for _, p := range pts {
				ns, ys = append(ns, p.Objects), append(ys, max(m.cost(p), m.floor)) // NaN stays NaN
			}
			w("- %s\n", growthSentence(m, s, classify(ns, ys)))
		}
		w("\n")
	}
	h.writeScaleErrors(b)
	if len(sc.Commands) > 0 {
		w("Commands (etcd's and Engram's server command lines are those of the tables above, etcd with the larger quota):\n\n```\n%s\n```\n", strings.Join(sc.Commands, "\n"))
	}
	return nil
}

// scaleCell formats one table cell, with the per-object figure for memory
// and disk and the delivery for watch.
func (h *harness) scaleCell(m scaleMetric, p scalePoint) string {
	v := m.value(p)
	if m.key == "recovery" && math.IsNaN(v) && p.RecoveryAtLeast > 0 {
		return "> " + fsecs(p.RecoveryAtLeast) + " (not serving yet when the wait ended)"
	}
	if math.IsNaN(v) {
		return "–"
	}
	s := m.format(v)
	switch {
	case m.key == "rss":
		// The file-backed part (mapped files: etcd's bbolt, badger's
		// tables) is reclaimable under pressure, the anonymous part not.
		s += fmt.Sprintf(" (%.0f; anon %s)", v/float64(p.Objects), fbytes(float64(p.RSS.Anon)))
	case m.key == "disk":
		s += fmt.Sprintf(" (%.0f)", v/float64(p.Objects))
	case strings.HasPrefix(m.key, "watch"):
		var n int
		fmt.Sscanf(strings.TrimPrefix(m.key, "watch"), "%d", &n)
		if sw, ok := watchAt(p, n); ok && sw.Delivered < 1 {
			s += fmt.Sprintf(" (%.2f%% delivered)", 100*sw.Delivered)
		}
	case (m.key == "list" || m.key == "listrss") && p.ListKeys < scaleListKeys:
		// Not the same list: the prefix holds only what was loaded.
		s = fmt.Sprintf("*%s (%s keys)*", s, objects(p.ListKeys))
	}
	if m.key == "list" && p.Lists > 0 {
		s += fmt.Sprintf(" ×%d", p.Lists)
	}
	return s
}

// writeScaleErrors lists what failed at single points.
func (h *harness) writeScaleErrors(b *strings.Builder) {
	var lines []string
	for _, p := range h.scale.Results {
		add := func(what, err string) {
			if err != "" {
				lines = append(lines, fmt.Sprintf("- %s at %s, %s: %s", p.Store, objects(p.Objects), what, oneLine(err, 300)))
			}
		}
		add("load", p.Error)
		add("get", p.Get.Error)
		add("create", p.Create.Error)
		add("list", p.ListError)
		add("recovery", p.RecoveryError)
		for _, sw := range p.Watch {
			add(fmt.Sprintf("watch with %d watchers", sw.Watchers), sw.Error)
		}
		if p.Keys > 0 && p.Keys != int64(p.Objects) {
			lines = append(lines, fmt.Sprintf("- %s at %s: the server held %d keys, not %d", p.Store, objects(p.Objects), p.Keys, p.Objects))
		}
	}
	if len(lines) > 0 {
		fmt.Fprintf(b, "Errors at single points:\n\n%s\n\n", strings.Join(lines, "\n"))
	}
}

func joinObjects(ns []int) string {
	var s []string
	for _, n := range ns {
		s = append(s, objects(n))
	}
	return strings.Join(s, ", ")
}

func joinInts(ns []int) string {
	var s []string
	for _, n := range ns {
		s = append(s, objects(n))
	}
	return strings.Join(s, ", ")
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
