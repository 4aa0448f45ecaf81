package etcddiff

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/etcdtest"
	"github.com/engramkv/engram/internal/proctest"
	"github.com/engramkv/engram/wasm/host"
)

// TestDiff sends one generated sequence to an oracle etcd 3.6 and to every
// target at once and compares each answer and each watch stream's
// responses. Each target is a subtest reporting its first difference (or
// how many operations agreed); the etcd target proves that the
// normalisation hides nothing etcd itself does not leave free.
func TestDiff(t *testing.T) {
	if raceEnabled {
		// The servers under test are race-tested by their own packages;
		// 20,000 operations through five servers under the detector
		// would only measure its overhead. `make test` runs this package
		// again without it.
		t.Skip("skipped under the race detector; run without -race")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("ENGRAM_DIFF_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("ENGRAM_DIFF_SEED=%q: %v", s, err)
		}
		seed = v
	}
	nops := 20000
	if s := os.Getenv("ENGRAM_DIFF_OPS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("ENGRAM_DIFF_OPS=%q: %v", s, err)
		}
		nops = v
	}
	skip := map[string]bool{}
	for _, c := range strings.Split(os.Getenv("ENGRAM_DIFF_SKIP"), ",") {
		if c = strings.TrimSpace(c); c != "" {
			if !contains(classes, c) {
				t.Fatalf("ENGRAM_DIFF_SKIP: unknown class %q (classes: %s)", c, strings.Join(classes, ","))
			}
			skip[c] = true
		}
	}
	names := []string{"etcd", "memkv", "badger", "wasm"}
	if s := os.Getenv("ENGRAM_DIFF_TARGETS"); s != "" {
		names = strings.Split(s, ",")
	}
	t.Logf("seed %d: ENGRAM_DIFF_SEED=%d reproduces this run; %d operations; targets %s; skipped classes %v",
		seed, seed, nops, strings.Join(names, ","), skip)

	etcdtest.Require(t)
	oracle := dial(t, "etcd (oracle)", etcdtest.Start(t, etcdtest.Options{}).Endpoint)
	var targets []*server
	for _, n := range names {
		targets = append(targets, startTarget(t, n))
	}
	start := time.Now()
	// ENGRAM_DIFF_TRACE logs every operation with etcd's answer.
	flush := defaultFlushEvery
	if s := os.Getenv("ENGRAM_DIFF_FLUSH"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("ENGRAM_DIFF_FLUSH=%q: want a positive count", s)
		}
		flush = v
	}
	r := &run{flushEvery: flush, seed: seed, oracle: oracle, targets: targets, gen: newGen(seed, skip), trace: os.Getenv("ENGRAM_DIFF_TRACE") != "", start: start}
	r.loop(t, nops)
	t.Logf("%d operations in %v; %d watch stream reads, %d of them for watchers from past revisions",
		r.done, time.Since(start).Round(time.Millisecond), r.syncs, r.catchUps)
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			if tg.diff != "" {
				t.Fatal(tg.diff)
			}
			t.Logf("%d operations, every answer the same as etcd's", tg.agreed)
		})
	}
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

// startTarget starts one target server for t.
func startTarget(t *testing.T, name string) *server {
	t.Helper()
	switch name {
	case "etcd":
		return dial(t, "etcd", etcdtest.Start(t, etcdtest.Options{}).Endpoint)
	case "memkv":
		return dial(t, "engram/memkv", servertest.Start(t, memkv.New(), servertest.Options{}).Endpoint)
	case "badger":
		st, err := badger.Open(badger.Options{Dir: t.TempDir()})
		if err != nil {
			t.Fatalf("badger: %v", err)
		}
		// Registered before the server's, so it runs after the server
		// stopped: servertest does not close a store it was given.
		t.Cleanup(func() { _ = st.Close() })
		return dial(t, "engram/badger", servertest.Start(t, st, servertest.Options{}).Endpoint)
	case "wasm":
		root, err := etcdtest.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(root, "wasm", "testplugins", "bin", "memkv.wasm")
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("%v: build it with `make plugins`", err)
		}
		// The cache `make test` fills before the tests (package
		// warmwasm), shared with the host's tests: loading from it takes
		// milliseconds, compiling seconds.
		cache, err := proctest.WasmCacheDir(path)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		p, err := host.Load(ctx, path, host.Options{CacheDir: cache, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatalf("loading %s: %v", path, err)
		}
		t.Cleanup(func() { _ = p.Close(ctx) })
		st, err := p.Open(ctx, host.StoreOptions{})
		if err != nil {
			t.Fatalf("opening a store on %s: %v", path, err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return dial(t, "engram/wasm-memkv", servertest.Start(t, st, servertest.Options{}).Endpoint)
	}
	t.Fatalf("ENGRAM_DIFF_TARGETS: unknown target %q (etcd, memkv, badger, wasm)", name)
	return nil
}

// run is one generated sequence sent to the oracle and the targets.
type run struct {
	seed    uint64
	oracle  *server
	targets []*server
	gen     *gen
	done    int
	// catchUps counts the syncs of watchers from past revisions, the
	// slowest operations (etcd syncs them every 100 ms).
	catchUps   int
	syncs      int // stream reads
	flushEvery int
	history    []string
	trace      bool
	start      time.Time // the last operations, for failure messages
}

// historyLen is how many earlier operations a failure message shows.
const historyLen = 10

func (r *run) loop(t *testing.T, nops int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range nops {
		live := []*server{r.oracle}
		for _, tg := range r.targets {
			if tg.diff == "" {
				live = append(live, tg)
			}
		}
		if len(live) == 1 {
			return
		}
		o := r.gen.next()
		if o.stream >= 0 {
			// Events of earlier writes first, so that they cannot race
			// the control response of this watch request.
			r.syncStreams(ctx, i, o, live, r.gen.flushPlan(o.stream))
		}
		answers := make([]answer, len(live))
		each(live, func(j int, s *server) { answers[j] = s.exec(ctx, o) })
		r.mapGrant(o, live, answers)
		r.gen.observe(o, answers[0].resp, answers[0].err)
		for _, w := range answers[0].watch {
			r.gen.observeWatch(o.stream, o, w)
		}
		for j, s := range live {
			byWatcher(answers[j].watch)
			s.render(&answers[j])
		}
		r.compare(i, o.String(), live, answers)
		r.remember(fmt.Sprintf("op %d: %s\n      -> %s", i, o, clip(answers[0].text, 1500)), false)
		if r.trace {
			t.Logf("op %d at %v: %s\n  etcd: %s%s", i, time.Since(r.start).Round(time.Millisecond), o, clip(answers[0].text, 300), ttl(answers[0]))
		}

		r.syncStreams(ctx, i, o, live, r.gen.syncPlan(o))
		if i%r.flushEvery == r.flushEvery-1 || i == nops-1 {
			r.syncStreams(ctx, i, o, live, r.gen.flushPlan(-1))
		}
		r.done = i + 1
	}
}

// defaultFlushEvery is how many operations may pass before the watch
// streams' events are read and compared: 1, after every write. etcd
// sends a synced watcher one response per revision; Engram's watchers
// send what has accumulated since their last response in one (core/
// internal/watch hub.go), so with writes landing between two reads the
// framing depends on timing. ENGRAM_DIFF_FLUSH=4 reads
// less often, to look at that; anything up to ~20 stays far below etcd's
// 128-response stream buffer, past which a watcher falls out of sync.
const defaultFlushEvery = 1

// syncStreams reads each stream of plan up to its sync point on every
// live server and compares the responses. Each server's progress
// requests go out on all its streams before any is read, so the round
// trips overlap.
func (r *run) syncStreams(ctx context.Context, i int, o *op, live []*server, plan []streamSync) {
	if len(plan) == 0 {
		return
	}
	batches := make([][]answer, len(plan))
	for k, p := range plan {
		batches[k] = make([]answer, len(live))
		r.syncs++
		if p.mode == syncCatchUp {
			r.catchUps++
		}
	}
	each(live, func(j int, s *server) {
		if s.diff != "" {
			return
		}
		for k, p := range plan {
			if p.mode == syncProgress {
				batches[k][j].err = s.requestProgress(ctx, p.stream)
			}
		}
		for k, p := range plan {
			if batches[k][j].err != nil {
				continue
			}
			mode := p.mode
			if mode == syncProgress {
				mode = syncAwait // requested above
			}
			batches[k][j].watch, batches[k][j].err = s.sync(ctx, p.stream, mode)
		}
	})
	for k, p := range plan {
		for _, w := range batches[k][0].watch {
			r.gen.observeWatch(p.stream, o, w)
		}
		for j, s := range live {
			byWatcher(batches[k][j].watch)
			s.render(&batches[k][j])
		}
		what := fmt.Sprintf("watch stream %d's responses up to op %d (%s)", p.stream, i, o)
		r.compare(i, what, live, batches[k])
		if len(batches[k][0].watch) > 0 {
			r.remember(fmt.Sprintf("      stream %d: %s", p.stream, clip(batches[k][0].text, 1500)), true)
		}
	}
}

// each runs f for every server at once and waits.
func each(ss []*server, f func(int, *server)) {
	var wg sync.WaitGroup
	for j, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(j, s)
		}()
	}
	wg.Wait()
}

// mapGrant records the lease IDs servers chose for a grant without an ID.
func (r *run) mapGrant(o *op, live []*server, answers []answer) {
	req, ok := o.build(func(id int64) int64 { return id }).(*pb.LeaseGrantRequest)
	if !ok || req.ID != 0 {
		return
	}
	want, ok := answers[0].resp.(*pb.LeaseGrantResponse)
	if !ok || answers[0].err != nil || want.Error != "" {
		return
	}
	for j, s := range live[1:] {
		if got, ok := answers[j+1].resp.(*pb.LeaseGrantResponse); ok && answers[j+1].err == nil && got.Error == "" {
			s.toOwn[want.ID] = got.ID
			s.toOracle[got.ID] = want.ID
		}
	}
}

// remember adds an operation to the history, or with more set what a
// stream read after it returned.
func (r *run) remember(s string, more bool) {
	if more && len(r.history) > 0 {
		r.history[len(r.history)-1] += "\n" + s
		return
	}
	r.history = append(r.history, s)
	if len(r.history) > historyLen {
		r.history = r.history[len(r.history)-historyLen:]
	}
}

// compare checks every target's answer against the oracle's and records
// the first difference of each.
func (r *run) compare(i int, what string, live []*server, answers []answer) {
	for j, s := range live[1:] {
		if s.diff != "" {
			continue
		}
		if same(answers[0], answers[j+1]) {
			s.agreed = i + 1
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "seed %d, op %d: %s differs from etcd (ENGRAM_DIFF_SEED=%d reproduces)\n", r.seed, i, s.name, r.seed)
		fmt.Fprintf(&b, "  request: %s\n", what)
		fmt.Fprintf(&b, "  etcd:    %s%s\n", clip(answers[0].text, 6000), ttl(answers[0]))
		fmt.Fprintf(&b, "  %-8s %s%s\n", s.name+":", clip(answers[j+1].text, 6000), ttl(answers[j+1]))
		b.WriteString("  the operations before it, with etcd's answers:\n")
		for _, l := range r.history {
			b.WriteString("    " + l + "\n")
		}
		s.diff = b.String()
	}
}

func ttl(a answer) string {
	if !a.hasTTL {
		return ""
	}
	return fmt.Sprintf(" (remaining TTL %d)", a.ttl)
}

// streamSync is one stream to bring to its sync point after an operation.
type streamSync struct {
	stream int
	mode   syncMode
}

// syncPlan says which watch streams to read after o, and how. Reads cause
// no events; writes and lease revocations mark the streams with watchers
// they may concern dirty, to be read at the next flush. A stream is read only when etcd
// will answer its progress request: it has an active watcher (etcd sends
// progress through one) and none created ahead of the store's revision.
func (g *gen) syncPlan(o *op) []streamSync {
	req := o.build(func(id int64) int64 { return id })
	switch w := req.(type) {
	case *pb.PutRequest, *pb.DeleteRangeRequest, *pb.TxnRequest, *pb.LeaseRevokeRequest:
		for _, sp := range writes(req) {
			for s := range nStreams {
				for _, w := range g.streams[s].active {
					if w.keys.overlaps(sp) {
						g.streams[s].dirty = true
					}
				}
			}
		}
	case *pb.WatchRequest:
		if !g.answerable(o.stream) {
			return nil
		}
		g.streams[o.stream].dirty = false
		switch {
		case w.GetProgressRequest() != nil:
			return []streamSync{{o.stream, syncAwait}}
		case o.catchUp:
			return []streamSync{{o.stream, syncCatchUp}}
		default:
			return []streamSync{{o.stream, syncProgress}}
		}
	}
	return nil
}

// flushPlan reads the dirty streams that can be read: stream only, or all
// when it is -1.
func (g *gen) flushPlan(stream int) []streamSync {
	var plan []streamSync
	for s := range nStreams {
		if (stream < 0 || s == stream) && g.streams[s].dirty && g.answerable(s) {
			g.streams[s].dirty = false
			plan = append(plan, streamSync{s, syncProgress})
		}
	}
	return plan
}

func (g *gen) answerable(s int) bool {
	sm := &g.streams[s]
	return sm.open && len(sm.active) > 0 && !sm.blocked(g.rev)
}
