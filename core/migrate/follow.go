package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/etcdfmt"
)

// watchOpts returns the key and options of the watch that follows the
// source from revision from: the whole keyspace, or the prefix.
func (m *migration) watchOpts(from int64) (string, []clientv3.OpOption) {
	opts := []clientv3.OpOption{clientv3.WithRev(from), clientv3.WithProgressNotify()}
	if len(m.opts.Prefix) == 0 {
		return "\x00", append(opts, clientv3.WithFromKey())
	}
	return string(m.opts.Prefix), append(opts, clientv3.WithPrefix())
}

// follow applies the source's revisions until the cut-over.
func (m *migration) follow(ctx context.Context, cutover <-chan struct{}) (Result, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	applied := m.im.Record().Applied
	key, wopts := m.watchOpts(applied + 1)
	wch := m.opts.Client.Watch(wctx, key, wopts...)
	if m.opts.Following != nil {
		m.opts.Following(applied + 1)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	// Commits are batched (see flushEvery); the timer commits what a
	// burst left once the watch goes quiet.
	flushTimer := time.NewTimer(flushEvery)
	flushTimer.Stop()
	var (
		// Zero: the first response after the watch starts commits at
		// once, so the position moves as soon as the source does.
		lastFlush  time.Time
		dirty      bool
		timerArmed bool
	)
	commit := func() error {
		dirty, lastFlush = false, time.Now()
		return m.flush(ctx)
	}
	var (
		cutStart  time.Time
		target    int64 // the source revision to drain to, once cutting over
		attempts  int
		lastRep   = time.Now()
		lastApply = applied
	)
	startCutover := func() error {
		rev, err := m.sourceRevision(ctx)
		if err != nil {
			return err
		}
		target = rev
		m.log.Info("cut-over: draining to the source's revision", "revision", target, "applied", m.im.Record().Applied)
		return m.requestProgress(wctx)
	}
	for {
		if a := m.im.Record().Applied; target != 0 && a >= target {
			done := false
			var res Result
			if a == target {
				var err error
				res, done, err = m.cutover(ctx, target)
				if err != nil || done {
					res.Drain = time.Since(cutStart)
					return res, err
				}
			} else {
				m.log.Warn("the source moved during the cut-over; draining again", "from", target, "to", a)
			}
			attempts++
			if attempts >= 5 {
				return Result{}, fmt.Errorf("%w: revision moved past %d %d times; stop every writer (kube-apiserver, controllers, lease holders) first", ErrNotQuiet, target, attempts)
			}
			if err := startCutover(); err != nil {
				return Result{}, err
			}
		}
		select {
		case <-ctx.Done():
			if err := m.flush(context.WithoutCancel(ctx)); err != nil {
				return Result{}, err
			}
			return Result{}, ctx.Err()
		case <-cutover:
			cutover = nil
			cutStart = time.Now()
			if err := m.flush(ctx); err != nil {
				return Result{}, err
			}
			if err := startCutover(); err != nil {
				return Result{}, err
			}
		case <-tick.C:
			if target != 0 {
				// Ask again: a progress request is answered only once
				// the watch has caught up.
				if err := m.requestProgress(wctx); err != nil {
					return Result{}, err
				}
			}
			if time.Since(m.lastSync) > m.opts.LeaseSyncInterval {
				if err := m.syncLeases(ctx); err != nil {
					return Result{}, err
				}
			}
			if m.opts.Progress != nil {
				m.pollSourceRevision(ctx)
			}
			a := m.im.Record().Applied
			m.report(Progress{Phase: phaseName(target), Applied: a, SourceRev: max(m.sourceRev, a), Rate: float64(a-lastApply) / time.Since(lastRep).Seconds()})
			lastApply, lastRep = a, time.Now()
		case resp, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					continue
				}
				return Result{}, errors.New("migrate: the source closed the watch")
			}
			if err := m.apply(ctx, resp); err != nil {
				return Result{}, err
			}
			dirty = true
			if since := time.Since(lastFlush); since >= flushEvery {
				if err := commit(); err != nil {
					return Result{}, err
				}
			} else if !timerArmed {
				flushTimer.Reset(flushEvery - since)
				timerArmed = true
			}
		case <-flushTimer.C:
			timerArmed = false
			if dirty {
				if err := commit(); err != nil {
					return Result{}, err
				}
			}
		}
	}
}

// flushEvery is how often the follow phase commits while the source keeps
// writing. Each commit is a durable engine commit (an fsync on badger), and
// the loop waits for it: committing after every watch response, as it once
// did, bounded the rate to the responses per fsync, and at 3,000 writes/s
// the migration fell further behind the longer the load lasted (DESIGN.md,
// "Migration"). The position committed is what a restart resumes from;
// nothing is served before the cut-over, which commits everything first.
const flushEvery = 200 * time.Millisecond

func phaseName(target int64) string {
	if target != 0 {
		return "cutover"
	}
	return "follow"
}

// apply imports one watch response.
func (m *migration) apply(ctx context.Context, resp clientv3.WatchResponse) error {
	if resp.CompactRevision != 0 {
		return fmt.Errorf("%w: it compacted at revision %d, the migration is at %d; run again with --restart (pause the source's compaction, e.g. kube-apiserver --etcd-compaction-interval=0, while migrating)", ErrSourceCompacted, resp.CompactRevision, m.im.Record().Applied)
	}
	if err := resp.Err(); err != nil {
		return fmt.Errorf("migrate: watch of the source: %w", err)
	}
	if resp.Header.Revision > m.sourceRev {
		m.sourceRev = resp.Header.Revision
	}
	if resp.IsProgressNotify() {
		return m.im.Advance(ctx, resp.Header.Revision)
	}
	var sub int64
	for i, ev := range resp.Events {
		if i > 0 && ev.Kv.ModRevision != resp.Events[i-1].Kv.ModRevision {
			sub = 0
		}
		row := etcdfmt.Entry{Rev: etcdfmt.Revision{Main: ev.Kv.ModRevision, Sub: sub}}
		sub++
		if ev.Type == mvccpb.DELETE {
			row.Tombstone = true
			row.KV = etcdfmt.KeyValue{Key: ev.Kv.Key, ModRevision: ev.Kv.ModRevision}
		} else {
			row.KV = etcdfmt.KeyValueOf(ev.Kv)
			if l := ev.Kv.Lease; l != 0 && !m.im.HasLease(l) {
				if err := m.fetchLease(ctx, l); err != nil {
					return err
				}
			}
		}
		if err := m.im.Add(ctx, &row); err != nil {
			return fmt.Errorf("migrate: apply revision %d: %w", row.Rev.Main, err)
		}
	}
	return nil
}

// progressTimeout bounds handing a progress request to the watch stream.
const progressTimeout = 5 * time.Second

// requestProgress asks the source's watch (wctx's stream) for a progress
// notification. It is bounded: clientv3 hands the request to the stream's
// goroutine (no round trip: that is at once), which does not take it while
// it reconnects to a source that is gone, and wctx has no deadline, so an
// unbounded call would hang the migration during the cut-over instead of
// ending it with an error.
func (m *migration) requestProgress(wctx context.Context) error {
	cctx, cancel := context.WithTimeout(wctx, progressTimeout)
	defer cancel()
	if err := m.opts.Client.RequestProgress(cctx); err != nil {
		return fmt.Errorf("migrate: request progress: %w", err)
	}
	return nil
}

// pollSourceRevision raises sourceRev to the source's current revision, for
// the progress report's "revisions behind": the watch's own headers lag as
// far as the migration does, so they would show it caught up when it is
// not. Bounded by a short timeout; a failure is left to the calls that
// must succeed (the lease sync).
func (m *migration) pollSourceRevision(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if r, err := m.opts.Client.Get(cctx, "\x00", clientv3.WithCountOnly()); err == nil && r.Header.Revision > m.sourceRev {
		m.sourceRev = r.Header.Revision
	}
}

// sourceRevision reads the source's current revision.
func (m *migration) sourceRevision(ctx context.Context) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	r, err := m.opts.Client.Get(cctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("migrate: read the source's revision: %w", err)
	}
	return r.Header.Revision, nil
}
