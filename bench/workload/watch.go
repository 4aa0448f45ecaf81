package workload

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/bench/result"
)

// watcher is one watch's receipt log.
type watcher struct {
	revs    []int64 // revisions received, in arrival order
	count   atomic.Int64
	lastRev int64
	order   int64 // events with a revision below one already received
	// openErr is set before the watch reports itself open (or failed to
	// open); err only after, and is read once the receiver has returned.
	openErr error
	err     error
}

// watch opens Watchers watches on the workload's prefix the way
// kube-apiserver's cacher does (W1: prefix, prev_kv, start at the current
// revision + 1, leader required), spread round-robin over the connections,
// then creates keys under the prefix at WatchRate for the duration. Each
// value carries its write's start time, so a watcher measures delivery
// latency from the start of the write to the receipt of the event. At the
// end every watcher's log is checked against the acknowledged writes: every
// watcher must receive every write exactly once, in revision order.
func (r *runner) watch(ctx context.Context) (*result.Result, error) {
	ks := newKeyspace(r.cfg.Prefix, Watch, r.cfg.KeySize, r.cfg.KeyOrder)
	head, err := r.conns[0].Get(ctx, ks.base, clientv3.WithRange(ks.end()), clientv3.WithCountOnly())
	if err != nil {
		return nil, fmt.Errorf("current revision: %w", err)
	}
	startRev := head.Header.Revision + 1

	rec := newRecorder()
	wctx, cancelWatches := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancelWatches()
	watchers := make([]*watcher, r.cfg.Watchers)
	var (
		wg      sync.WaitGroup
		created sync.WaitGroup
	)
	note(r.cfg.Progress, "opening %d watches", len(watchers))
	for i := range watchers {
		w := &watcher{}
		watchers[i] = w
		wch := r.conn(i).Watch(wctx, ks.base, clientv3.WithRange(ks.end()), clientv3.WithPrevKV(),
			clientv3.WithRev(startRev), clientv3.WithCreatedNotify())
		created.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.receive(wctx, i, w, wch, rec, created.Done)
		}()
	}
	created.Wait()
	for _, w := range watchers {
		if w.openErr != nil {
			return nil, fmt.Errorf("open watch: %w", w.openErr)
		}
	}

	// Writers: Clients loops sharing the pacer, each remembering the
	// revisions the server acknowledged.
	var (
		next    atomic.Int64
		ackMu   sync.Mutex
		acked   []int64
		writeWG sync.WaitGroup
		pace    = newPacer(r.cfg.WatchRate)
		start   = time.Now()
		end     = start.Add(r.cfg.Duration)
		wrec    = newRecorder() // write errors and the write count
	)
	pace.start(start)
	stopProgress := startProgress(r.cfg.Progress, Watch, start, r.cfg.Duration, &wrec.ops, &wrec.errs)
	for c := range r.cfg.Clients {
		writeWG.Add(1)
		go func() {
			defer writeWG.Done()
			value := slices.Clone(r.value)
			var mine []int64
			for ctx.Err() == nil && time.Now().Before(end) {
				if err := pace.wait(ctx, end); err != nil {
					break
				}
				t0 := time.Now()
				binary.BigEndian.PutUint64(value, uint64(t0.Sub(r.base)))
				resp, err := r.createTxn(ctx, r.conn(c), ks.key(int(next.Add(1))), value)
				switch {
				case err != nil && ctx.Err() != nil:
				case err != nil:
					wrec.fail(fmt.Errorf("write: %w", err))
				case !resp.Succeeded:
					wrec.fail(fmt.Errorf("write: create of a fresh key lost its compare"))
				default:
					mine = append(mine, resp.Header.Revision)
					wrec.record(c, time.Since(t0))
				}
			}
			ackMu.Lock()
			acked = append(acked, mine...)
			ackMu.Unlock()
		}()
	}
	writeWG.Wait()
	writeSeconds := time.Since(start).Seconds()
	stopProgress()

	// Drain: wait until every watcher has seen as many events as there were
	// acknowledged writes, or WatchDrain has passed.
	note(r.cfg.Progress, "waiting for %d events", int64(len(acked))*int64(len(watchers)))
	drainEnd := time.Now().Add(r.cfg.WatchDrain)
	for time.Now().Before(drainEnd) && ctx.Err() == nil {
		done := true
		for _, w := range watchers {
			if w.count.Load() < int64(len(acked)) {
				done = false
				break
			}
		}
		if done {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(start)
	cancelWatches()
	wg.Wait()
	note(r.cfg.Progress, "")

	slices.Sort(acked)
	stats := &result.Watch{Watchers: len(watchers), Writes: int64(len(acked)), Expected: int64(len(acked)) * int64(len(watchers))}
	for _, w := range watchers {
		got := slices.Clone(w.revs)
		slices.Sort(got)
		got = slices.Compact(got)
		stats.Duplicates += int64(len(w.revs) - len(got))
		for _, rev := range got {
			if _, ok := slices.BinarySearch(acked, rev); ok {
				stats.Received++
			}
		}
		stats.OutOfOrder += w.order
		if w.err != nil && ctx.Err() == nil {
			rec.fail(w.err)
		}
	}
	stats.Missing = stats.Expected - stats.Received
	stats.WriteRate = float64(stats.Writes) / writeSeconds

	res := rec.result(Watch, "events/s", elapsed)
	res.Ops = stats.Received
	res.Throughput = float64(stats.Received) / elapsed.Seconds()
	res.Errors += wrec.errs.Load()
	for _, s := range wrec.result(Watch, "", elapsed).ErrorSamples {
		if len(res.ErrorSamples) < maxErrorSample {
			res.ErrorSamples = append(res.ErrorSamples, s)
		}
	}
	res.Watch = stats
	return res, nil
}

// receive logs one watch's events until its channel closes. created is
// called once the watch is open (or has failed to open).
func (r *runner) receive(ctx context.Context, i int, w *watcher, wch clientv3.WatchChan, rec *recorder, created func()) {
	opened := false
	defer func() {
		if !opened {
			if w.openErr == nil {
				w.openErr = fmt.Errorf("watch %d closed before it was created", i)
			}
			created()
		}
	}()
	for resp := range wch {
		if err := resp.Err(); err != nil {
			switch {
			case !opened:
				w.openErr = fmt.Errorf("watch %d: %w", i, err)
			case ctx.Err() == nil:
				w.err = fmt.Errorf("watch %d: %w", i, err)
			}
			return
		}
		if resp.Created && !opened {
			opened = true
			created()
		}
		now := time.Since(r.base)
		for _, ev := range resp.Events {
			rev := ev.Kv.ModRevision
			if rev < w.lastRev {
				w.order++
			}
			w.lastRev = max(w.lastRev, rev)
			w.revs = append(w.revs, rev)
			w.count.Add(1)
			if len(ev.Kv.Value) >= 8 {
				sent := time.Duration(binary.BigEndian.Uint64(ev.Kv.Value))
				rec.record(i, now-sent)
			}
		}
	}
}
