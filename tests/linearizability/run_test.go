package linearizability

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	numClients = 8
	// opsPerSecond over all clients: the runs are specified at about
	// 1,000 operations a second.
	opsPerSecond = 1000
	opTimeout    = 2 * time.Second
)

// faults is what a run's fault schedule works with.
type faults struct {
	t   *testing.T
	run context.Context // the whole run's, which outlives the schedule's
	rec *Recorder
	cli *clientv3.Client // every endpoint; for read-backs and status
	rng *rand.Rand
	eps []string
	mu  sync.Mutex
	log []string
	// counts of what was done, by kind ("kill", "failover", ...).
	counts map[string]int
	// events are the noted events but read-backs, for recovery.
	events []faultEvent
}

// faultEvent is a noted event and when it happened (Recorder time).
type faultEvent struct {
	kind string
	at   int64
}

// note records a fault event with its time in the history.
func (f *faults) note(kind, format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if kind != "" {
		f.counts[kind]++
		if kind != "readback" {
			f.events = append(f.events, faultEvent{kind, f.rec.Now()})
		}
	}
	f.log = append(f.log, fmt.Sprintf("[%.4fs] %s", seconds(f.rec.Now()), fmt.Sprintf(format, args...)))
}

// readback reads every key after a restart or failover; the checker
// verifies that every write acknowledged before it shows. It is not cut
// short when the schedule's time is up.
func (f *faults) readback(why string) {
	ctx, cancel := context.WithTimeout(f.run, time.Minute)
	defer cancel()
	op, err := Readback(ctx, f.cli, f.rec, numClients, why)
	if err != nil {
		f.t.Errorf("read-back after %s failed: %v", why, err)
		return
	}
	f.note("readback", "read-back after %s at rev %d", why, op.Resp.Rev)
}

// recovery says, for each noted event, how long after it the first write
// that a client sent after it was acknowledged having changed the store:
// the outage of writes a client saw. (A failed compare is answered
// without a commit, so it does not count.)
func (f *faults) recovery(h History) string {
	var parts []string
	for _, e := range f.events {
		first := int64(-1)
		for _, op := range h.Ops {
			if _, ok := op.Acknowledged(); ok && op.Call >= e.at && (first < 0 || op.Return < first) {
				first = op.Return
			}
		}
		if first < 0 {
			parts = append(parts, e.kind+" never")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s +%.2fs", e.kind, seconds(first-e.at)))
	}
	return strings.Join(parts, ", ")
}

// progress waits until n more writes were acknowledged, so that a
// schedule's last event has writes after it in the history (and in
// recovery's figures) before the load stops.
func (f *faults) progress(n int) {
	ctx, cancel := context.WithTimeout(f.run, time.Minute)
	defer cancel()
	if err := f.rec.AwaitAcknowledged(ctx, f.rec.Acknowledged()+n); err != nil {
		f.t.Errorf("no progress after the last event: %v", err)
	}
}

// wait pauses the fault schedule for d or until ctx ends; it reports
// whether the run goes on. (The schedule's pacing, not synchronisation.)
func (f *faults) wait(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// between is a random duration in [lo, hi).
func (f *faults) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(f.rng.Int63n(int64(hi-lo)))
}

type runConfig struct {
	endpoints []string
	// pinned connects each client to one endpoint (LoadOptions.Pinned).
	pinned bool
	// failures, if set, judges the clients' failed operations once the
	// load stopped; without it they are only counted.
	failures func(fs []Failure)
	// schedule injects faults until ctx ends and leaves every node
	// running and the cluster serving when it returns.
	schedule func(ctx context.Context, f *faults)
}

// runChecked drives the load and the watcher against cfg's servers for the
// run's duration while cfg.schedule injects faults, then checks the
// history. A failure prints the seed and leaves the history on disk.
func runChecked(t *testing.T, cfg runConfig) {
	duration, seed := runDuration(t), runSeed(t)
	t.Logf("seed %d (ENGRAM_LIN_SEED=%d repeats the clients' choices), %v of load", seed, seed, duration)
	ctx, cancel := context.WithTimeout(context.Background(), duration+5*time.Minute)
	defer cancel()

	rec := NewRecorder()
	rb, err := NewClient(cfg.endpoints)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	w, err := StartWatcher(ctx, rec, cfg.endpoints)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	load, err := StartLoad(ctx, rec, LoadOptions{Endpoints: cfg.endpoints, Clients: numClients, Rate: opsPerSecond, OpTimeout: opTimeout, Seed: seed, Pinned: cfg.pinned})
	if err != nil {
		t.Fatal(err)
	}
	f := &faults{t: t, run: ctx, rec: rec, cli: rb, rng: rand.New(rand.NewSource(seed)), eps: cfg.endpoints, counts: map[string]int{}}
	fctx, fcancel := context.WithTimeout(ctx, duration)
	cfg.schedule(fctx, f)
	fcancel()
	load.Stop()
	if cfg.failures != nil {
		cfg.failures(load.Failures())
	}
	if t.Failed() {
		return
	}

	final, err := Readback(ctx, rb, rec, numClients, "the end of the load")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	complete := w.WaitFor(wctx, final.Resp.Rev)
	wcancel()
	w.Stop()
	h := rec.History()
	h.FinalRev, h.WatchComplete = final.Resp.Rev, complete

	dir := os.Getenv("ENGRAM_LIN_ARTIFACTS")
	if dir == "" {
		dir, err = os.MkdirTemp("", "engram-linearizability-")
		if err != nil {
			t.Fatal(err)
		}
	}
	name := strings.ReplaceAll(t.Name(), "/", "-")
	res := Check(h, Options{Timeout: 3 * time.Minute, VisualizePath: filepath.Join(dir, name+".html")})
	var counts []string
	for k, v := range f.counts {
		counts = append(counts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(counts)
	t.Logf("%s", res.Summary())
	t.Logf("faults: %s; client errors %d; watch restarts by cause %v", strings.Join(counts, ", "), load.Errors(), w.Ends())
	errs := map[string]int{}
	for _, op := range h.Ops {
		if op.Resp.Unknown {
			errs[op.Note]++
		}
	}
	t.Logf("unknown writes by error: %v", errs)
	t.Logf("first acknowledged write after each event: %s", f.recovery(h))
	histPath := filepath.Join(dir, name+".history.txt")
	if res.OK() {
		if os.Getenv("ENGRAM_LIN_ARTIFACTS") == "" {
			_ = os.RemoveAll(dir)
		} else {
			_ = WriteHistory(h, histPath)
		}
		return
	}
	_ = WriteHistory(h, histPath)
	t.Logf("fault schedule:\n%s", strings.Join(f.log, "\n"))
	t.Errorf("seed %d: the history fails the check (history in %s):\n%s", seed, histPath, strings.Join(res.Problems, "\n"))
}
