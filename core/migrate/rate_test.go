package migrate_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/migrate"
	"github.com/engramkv/engram/internal/kinetest"
	"github.com/engramkv/engram/internal/pgtest"
)

// soakEnv enables the migration's long measurements (make soak).
const soakEnv = "ENGRAM_MIGRATE_SOAK"

// envInt reads an integer setting of a soak run.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return n
}

// TestFollowRate measures how far the follow phase falls behind a source
// (a real etcd, or kine on PostgreSQL with ENGRAM_MIGRATE_SOURCE=kine)
// taking ENGRAM_MIGRATE_RATE writes/s (default 3000, the rate of
// DESIGN.md's "Follow-phase rate") for ENGRAM_MIGRATE_SECONDS (default
// 20): 512-byte puts on 5000 keys
// from 64 clients, paced. It samples the committed position against the
// last acknowledged write every 250 ms, and after the load how long the
// migration takes to catch up. It asserts nothing about speed (the numbers
// are DESIGN.md's), only that the cut-over then verifies.
func TestFollowRate(t *testing.T) {
	if os.Getenv(soakEnv) == "" {
		t.Skip("soak only (" + soakEnv + "=1, make soak)")
	}
	rate := envInt(t, "ENGRAM_MIGRATE_RATE", 3000)
	seconds := envInt(t, "ENGRAM_MIGRATE_SECONDS", 20)
	ctx := testCtx(t, time.Duration(seconds)*time.Second+3*time.Minute)
	var src *clientv3.Client
	switch source := os.Getenv("ENGRAM_MIGRATE_SOURCE"); source {
	case "", "etcd":
		_, src = startSource(t)
	case "kine":
		k := kinetest.Start(t, pgtest.Start(t), kinetest.Options{})
		src = dial(t, k.Endpoint)
	default:
		t.Fatalf("ENGRAM_MIGRATE_SOURCE=%q: want etcd or kine", source)
	}
	w := &writer{cli: src}
	st := openBadger(t, "")
	var logs logBuffer
	pl := newProgressLog(nil)
	cut := make(chan struct{})
	ch := runAsync(ctx, migrate.Options{Client: src, Source: "rate", Store: st, TempDir: t.TempDir(), Logger: logs.logger(), Progress: pl.record}, cut)
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if _, err := pl.waitFor(wctx, func(p migrate.Progress) bool { return p.Phase == "follow" }); err != nil {
		t.Fatalf("%v\nlog:\n%s", err, logs.String())
	}
	start := w.maxRev.Load()

	// Tokens at the target rate, every 10 ms; writers take them.
	tokens := make(chan struct{}, rate)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var loadErr error
	var errOnce sync.Once
	val := strings.Repeat("x", 512)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				case <-tokens:
				}
				if err := w.put(ctx, fmt.Sprintf("/registry/pods/ns/pod-%04d", (i*7919+n)%5000), val); err != nil {
					errOnce.Do(func() { loadErr = err })
					return
				}
			}
		}()
	}
	pace := time.NewTicker(10 * time.Millisecond)
	sample := time.NewTicker(250 * time.Millisecond)
	loadStart := time.Now()
	end := time.NewTimer(time.Duration(seconds) * time.Second)
	var lags []int64
	perTick := max(rate/100, 1)
	for running := true; running; {
		select {
		case <-pace.C:
			for range perTick {
				select {
				case tokens <- struct{}{}:
				default:
				}
			}
		case <-sample.C:
			rec, err := mvcc.ReadImportRecord(ctx, st)
			if err != nil || rec == nil {
				t.Fatalf("import record: %v, %v", rec, err)
			}
			lags = append(lags, max(w.maxRev.Load()-rec.Applied, 0))
		case <-end.C:
			running = false
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	close(stop)
	wg.Wait()
	pace.Stop()
	loadTime := time.Since(loadStart)
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	last := w.maxRev.Load()
	lagAtEnd := int64(-1)
	caughtUp := time.Now()
	for {
		rec, err := mvcc.ReadImportRecord(ctx, st)
		if err != nil || rec == nil {
			t.Fatalf("import record: %v, %v", rec, err)
		}
		if lagAtEnd < 0 {
			lagAtEnd = max(last-rec.Applied, 0)
		}
		if rec.Applied >= last {
			break
		}
		select {
		case <-sample.C:
		case <-ctx.Done():
			t.Fatalf("catching up to %d: %v", last, ctx.Err())
		}
	}
	catchUp := time.Since(caughtUp)
	sample.Stop()
	close(cut)
	r := waitRun(t, ch, 2*time.Minute)
	if r.err != nil {
		t.Fatalf("cut-over: %v\nlog:\n%s", r.err, logs.String())
	}
	writes := last - start
	t.Logf("load: %d writes in %v = %.0f writes/s (target %d/s)", writes, loadTime.Round(time.Millisecond), float64(writes)/loadTime.Seconds(), rate)
	t.Logf("lag (last acknowledged write minus committed position, every 250 ms): %s", lagStats(lags))
	t.Logf("at the end of the load: %d revisions behind, caught up %v later; cut-over: %s in %v", lagAtEnd, catchUp.Round(10*time.Millisecond), r.res.Verified, r.res.Drain.Round(time.Millisecond))
}
