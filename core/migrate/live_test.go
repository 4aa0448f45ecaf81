package migrate_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/migrate"
	"github.com/engramkv/engram/core/server/servertest"
)

// The load of TestLiveMigration: liveWriters concurrent writers of
// *liveOps operations each on liveKeys keys. Range is compared at every
// revision, so the default stays small enough for the race detector;
// measure the lag under a longer load with e.g. -live.ops=5000.
const (
	liveWriters = 4
	liveKeys    = 40
)

var liveOps = flag.Int("live.ops", 300, "operations per writer in TestLiveMigration")

// TestLiveMigration migrates a real etcd into badger while four writers
// load it, cuts over once they stop, and checks the result as a client
// would: a watcher that started on etcd resumes on Engram from its last
// revision and sees every revision exactly once and in order; Engram
// replays the same events (prev_kv included), serves the same Range at
// every revision since the compaction, the same HashKV and the same
// leases, and its first write gets the revision after the cut-over.
func TestLiveMigration(t *testing.T) {
	t.Parallel()
	// The bound grows with a load made longer with -live.ops.
	ctx := testCtx(t, time.Duration(max(1, *liveOps/300))*2*time.Minute)
	e, src := startSource(t)
	w := &writer{cli: src}
	compactRev, err := preload(ctx, w, rand.New(rand.NewPCG(1, 2)), []string{"/pre/"}, 300)
	if err != nil {
		t.Fatal(err)
	}
	preRev, preOps := w.maxRev.Load(), w.ops.Load()
	t.Logf("preloaded: %d operations up to revision %d, compacted at %d", w.ops.Load(), preRev, compactRev)

	// A client of the source, watching everything since the compaction.
	var (
		swMu      sync.Mutex
		srcEvents []event
		swNotify  = make(chan struct{}, 1)
		swErr     error
	)
	swCtx, swCancel := context.WithCancel(ctx)
	defer swCancel()
	swDone := make(chan struct{})
	swch := src.Watch(clientv3.WithRequireLeader(swCtx), "\x00", clientv3.WithFromKey(), clientv3.WithRev(compactRev+1), clientv3.WithPrevKV())
	go func() {
		defer close(swDone)
		for resp := range swch {
			swMu.Lock()
			if err := resp.Err(); err != nil && swCtx.Err() == nil {
				swErr = err
			}
			for _, ev := range resp.Events {
				srcEvents = append(srcEvents, toEvent(ev))
			}
			swMu.Unlock()
			select {
			case swNotify <- struct{}{}:
			default:
			}
		}
	}()

	// The migration, following until the cut-over.
	var loading atomic.Bool
	pl := newProgressLog(func() int64 {
		if loading.Load() {
			return w.maxRev.Load()
		}
		return 0
	})
	var logs logBuffer
	st := openBadger(t, "")
	cut := make(chan struct{})
	following := make(chan int64, 1)
	runCh := runAsync(ctx, migrate.Options{
		Client: src, Source: e.ClientURL, Store: st, TempDir: t.TempDir(),
		Logger: logs.logger(), Progress: pl.record,
		Following: func(from int64) { following <- from },
	}, cut)
	var from int64
	select {
	case from = <-following:
	case r := <-runCh:
		t.Fatalf("migrate.Run: %+v, %v\nlog:\n%s", r.res, r.err, logs.String())
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}

	// The load, count-bounded. While it runs, the migration's committed
	// position (its import record) is sampled: it must advance, and how far
	// it is behind the last acknowledged write is the lag.
	loading.Store(true)
	loadStart := time.Now()
	loadDone := make(chan error, 1)
	go func() { loadDone <- loadWriters(ctx, w, []string{"/load/"}, liveKeys, liveWriters, *liveOps, nil) }()
	var (
		lags       []int64
		appliedMax int64
	)
	tick := time.NewTicker(20 * time.Millisecond)
	for done := false; !done; {
		select {
		case err := <-loadDone:
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			done = true
		case <-tick.C:
			acked := w.maxRev.Load()
			rec, err := mvcc.ReadImportRecord(ctx, st)
			if err != nil || rec == nil {
				t.Fatalf("import record while following: %v, %v", rec, err)
			}
			if acked > preRev {
				lags = append(lags, max(acked-rec.Applied, 0))
			}
			appliedMax = max(appliedMax, rec.Applied)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	tick.Stop()
	loading.Store(false)
	loadTime := time.Since(loadStart)
	ops := w.ops.Load() - preOps
	lastAcked := w.maxRev.Load()
	if appliedMax < from {
		t.Fatalf("the migration applied nothing while the writers ran (position %d, following from %d)", appliedMax, from)
	}

	close(cut)
	r := waitRun(t, runCh, 60*time.Second)
	if r.err != nil {
		t.Fatalf("migrate.Run: %v\nlog:\n%s", r.err, logs.String())
	}
	res := r.res
	srcRev, err := src.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if res.Rev != lastAcked || res.Rev != srcRev.Header.Revision || res.CompactRev != compactRev || res.BaseRev < preRev {
		t.Fatalf("result %+v; the source is at %d, last acknowledged write %d, compacted %d, preload up to %d", res, srcRev.Header.Revision, lastAcked, compactRev, preRev)
	}
	if !strings.Contains(res.Verified, "HashKV") {
		t.Errorf("Verified = %q, want a HashKV comparison", res.Verified)
	}

	// The source's client has everything up to the cut-over; it switches.
	for {
		swMu.Lock()
		last, err := lastRev(srcEvents), swErr
		swMu.Unlock()
		if err != nil {
			t.Fatalf("source watch: %v", err)
		}
		if last >= res.Rev {
			break
		}
		select {
		case <-swNotify:
		case <-ctx.Done():
			t.Fatalf("the source's watcher is at %d, the cut-over at %d: %v", last, res.Rev, ctx.Err())
		}
	}
	swCancel()
	<-swDone
	if last := lastRev(srcEvents); last != res.Rev {
		t.Fatalf("the source's watcher got revision %d past the cut-over %d", last, res.Rev)
	}

	srv := servertest.Start(t, st, servertest.Options{})
	eng := srv.Client(t)
	resumed := eng.Watch(clientv3.WithRequireLeader(ctx), "\x00", clientv3.WithFromKey(), clientv3.WithRev(lastRev(srcEvents)+1), clientv3.WithPrevKV())
	first, err := eng.Put(ctx, "/after/a", "1")
	if err != nil {
		t.Fatal(err)
	}
	if first.Header.Revision != res.Rev+1 {
		t.Fatalf("the first write on Engram got revision %d, want %d", first.Header.Revision, res.Rev+1)
	}
	if _, err := eng.Txn(ctx).Then(clientv3.OpPut("/after/b", "2"), clientv3.OpPut("/after/c", "3"), clientv3.OpDelete("/after/a")).Commit(); err != nil {
		t.Fatal(err)
	}
	final, err := eng.Delete(ctx, "/after/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var engEvents []event
	for lastRev(engEvents) < final.Header.Revision {
		select {
		case resp := <-resumed:
			if err := resp.Err(); err != nil {
				t.Fatalf("resumed watch: %v", err)
			}
			for _, ev := range resp.Events {
				engEvents = append(engEvents, toEvent(ev))
			}
		case <-ctx.Done():
			t.Fatalf("resumed watch: at %d, want %d: %v", lastRev(engEvents), final.Header.Revision, ctx.Err())
		}
	}
	if err := checkDense(slices.Concat(srcEvents, engEvents), compactRev+1, final.Header.Revision); err != nil {
		t.Errorf("events across the switch: %v", err)
	}

	compareAll(t, ctx, src, eng, "", compactRev+1, res.Rev, srcEvents)
	if t.Failed() {
		t.Logf("migration log:\n%s", logs.String())
	}

	reports, behind := pl.snapshot()
	var follow []string
	for _, r := range reports {
		if r.Phase != "base" {
			follow = append(follow, fmt.Sprintf("%s %d/%d", r.Phase, r.Applied, r.SourceRev))
			if r.Applied < from-1 || r.Applied > r.SourceRev || r.SourceRev > res.Rev {
				t.Errorf("progress report %+v: want base %d <= applied <= source revision <= %d", r, from-1, res.Rev)
			}
		}
	}
	t.Logf("load: %d writers, %d operations acknowledged (revisions %d..%d) in %v (%.0f ops/s)",
		liveWriters, ops, preRev+1, lastAcked, loadTime.Round(time.Millisecond), float64(ops)/loadTime.Seconds())
	t.Logf("lag while following under load (last acknowledged write minus committed position, every 20 ms): %s", lagStats(lags))
	t.Logf("progress reports (applied/source revision): %v; behind the last acknowledged write at each follow report under load: %v", follow, behind)
	t.Logf("cut-over: drain %v, result %+v", res.Drain.Round(time.Millisecond), res)
}

// lagStats summarizes lag samples.
func lagStats(lags []int64) string {
	if len(lags) == 0 {
		return "no samples"
	}
	s := slices.Clone(lags)
	slices.Sort(s)
	var sum int64
	for _, l := range s {
		sum += l
	}
	return fmt.Sprintf("%d samples, median %d, p90 %d, max %d, mean %.0f revisions", len(s), s[len(s)/2], s[len(s)*9/10], s[len(s)-1], float64(sum)/float64(len(s)))
}
