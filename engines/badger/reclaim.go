package badger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	badgerdb "github.com/dgraph-io/badger/v3"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/groupcommit"
)

// Space reclamation after deletes.
//
// The core keeps every revision of a key as its own engine key and a
// compaction deletes the old ones, so under kube-apiserver's churn most of
// what the engine has ever written is deleted a few minutes later. Badger
// keeps values under its 1 MiB threshold in the LSM tree, not in the value
// log, so value-log GC frees none of it; the space comes back only when LSM
// compaction merges a tombstone with the versions it hides into the bottom
// level. Left alone that takes long: badger compacts a level only when it is
// over its size target, and a store whose live data is small never fills
// them, so the deleted revisions and their tombstones stay on disk
// indefinitely, and so does the write-ahead file of the memtable holding
// the tombstones, which badger rewrites only when the memtable fills.
// Measurements before and after: (DESIGN.md, "Space reclamation on
// badger").
//
// So the store drives the reclamation itself once the core has deleted a
// sizeable share of what the tree holds and the deletes have stopped
// arriving (the core deletes a compacted range in chunks, in a burst), or
// have gone on for a minute:
//
//  1. The deletes must be in tables. While commits keep arriving, badger
//     flushes the memtable by itself soon, and the loop waits for that.
//     When the store is idle the memtable is flushed by force (badger
//     offers no flush call; DropPrefix of a marker key under the adaptor's
//     own reclaimPrefix does it, and drops the marker). The forced flush
//     runs on the committer goroutine between two groups, because
//     DropPrefix refuses concurrent writes with ErrBlockedWrites: commits
//     would queue for the flush (over a second with a full memtable),
//     which is why a busy store is not flushed by force.
//  2. Flatten compacts every level into the bottom one, where tombstones and
//     the versions they hide are dropped. Commits continue meanwhile; badger
//     pauses only its own background compactions.
const (
	// reclaimPrefix namespaces the flush marker; user keys use dataPrefix,
	// so no Scan or Get can see it.
	reclaimPrefix = 'r'
	// reclaimCheck is how often the deletes since the last reclamation are
	// looked at.
	reclaimCheck = 10 * time.Second
	// reclaimMinDeletes and reclaimShare are the trigger: at least this
	// many deletes, and at least this share of the keys the tree holds
	// (tombstones and hidden versions included), so that a store that
	// deletes little never rewrites its tables for it.
	reclaimMinDeletes = 10_000
	reclaimShare      = 0.25
	// reclaimMaxWait is how many checks a busy store waits for badger to
	// flush the deletes by itself before the flush is forced.
	reclaimMaxWait = 12
	// reclaimMaxBurst is how many checks a reclamation waits for the
	// deletes to stop before it runs while they continue.
	reclaimMaxBurst = 6
)

var reclaimMarker = []byte{reclaimPrefix, 'f', 'l', 'u', 's', 'h'}

// reclaimer is the state of the reclamation loop.
type reclaimer struct {
	// deletes counts deletes committed since Open, pending those counted
	// when the last reclamation started.
	deletes atomic.Int64
	pending atomic.Int64
	// mu makes reclamations one at a time.
	mu       sync.Mutex
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	// runs counts completed reclamations (for tests and logs).
	runs atomic.Int64
}

// noteDeletes counts the deletes of a committed batch.
func (s *Store) noteDeletes(ops []kv.Op) {
	var n int64
	for _, op := range ops {
		if op.Kind == kv.OpDelete || op.Kind == kv.OpCompareAndDelete {
			n++
		}
	}
	if n > 0 {
		s.reclaim.deletes.Add(n)
	}
}

// startReclaim starts the reclamation loop for a durable store; an
// in-memory store has no disk to give back.
func (s *Store) startReclaim(enabled bool) {
	s.reclaim.stop = make(chan struct{})
	s.reclaim.done = make(chan struct{})
	if !enabled || s.inMemory {
		close(s.reclaim.done)
		return
	}
	go s.runReclaim()
}

// stopReclaim ends the loop, waiting for a reclamation under way to finish
// (badger's Flatten cannot be interrupted). Close calls it before it takes
// the gate.
func (s *Store) stopReclaim() {
	s.reclaim.stopOnce.Do(func() { close(s.reclaim.stop) })
	<-s.reclaim.done
}

func (s *Store) runReclaim() {
	defer close(s.reclaim.done)
	t := time.NewTicker(reclaimCheck)
	defer t.Stop()
	checks := reclaimChecks{last: s.reclaim.deletes.Load(), lastBatches: s.stats.Batches()}
	// waitTs is badger's last commit when a due reclamation found writes
	// flowing; 0 when none is waiting.
	var (
		waitTs uint64
		waited int
	)
	for {
		select {
		case <-s.reclaim.stop:
			return
		case <-t.C:
		}
		due, busy := checks.check(s.reclaim.deletes.Load(), s.stats.Batches(), s.reclaim.pending.Load(), s.reclaimDue)
		if !due {
			waitTs, waited = 0, 0
			continue
		}
		flush := true
		// A trickle of writes may take long to fill the memtable; after
		// reclaimMaxWait the flush is forced after all, and then it stalls
		// few commits.
		if busy && waited < reclaimMaxWait {
			// Writes fill the memtable and badger flushes it by itself
			// within seconds; forcing the flush now would make every
			// commit wait for it (over a second with a full memtable).
			// So wait until the memtable holding the deletes is in a
			// table, then compact the tables alone.
			if waitTs == 0 {
				waitTs = s.lastCommitTs()
			}
			if !s.flushedThrough(waitTs) {
				waited++
				continue
			}
			flush = false
		}
		waitTs, waited = 0, 0
		err := s.reclaim1(flush)
		if err != nil && !errors.Is(err, kv.ErrClosed) {
			s.log.Warn("reclaiming deleted space failed", "err", err)
		}
		if err == nil {
			checks.reclaimed()
		}
	}
}

// reclaimChecks decides, at each check of the loop, whether a reclamation
// is due, from the delete and batch counters alone (no clock, no engine),
// so that its rules are tested step by step.
type reclaimChecks struct {
	last        int64
	lastBatches uint64
	// bursting counts consecutive checks that saw deletes arrive.
	bursting int
	// midBurst: the last reclamation ran while deletes were still
	// arriving, so the rest of that burst is owed a pass of its own.
	midBurst bool
}

// check takes the counters at this check (deletes committed since Open,
// batches committed, and the deletes counted when the last reclamation
// started) and reports whether a reclamation is due, and whether writes
// arrived since the last check. due is the size rule (reclaimDue).
func (c *reclaimChecks) check(deletes int64, batches uint64, pending int64, due func(deletes int64) bool) (run, busy bool) {
	burst := deletes != c.last
	busy = batches != c.lastBatches
	c.last, c.lastBatches = deletes, batches
	if burst {
		c.bursting++
	} else {
		c.bursting = 0
	}
	// Under sustained writes the core's physical compaction can delete
	// for minutes on end (it deletes about as fast as the history was
	// written: DESIGN.md, "Compaction's rule"), so a burst is waited out
	// only for reclaimMaxBurst checks.
	if burst && c.bursting < reclaimMaxBurst {
		return false, busy
	}
	if due(deletes) {
		return true, busy
	}
	// A reclamation in the middle of a burst reset the count, and what
	// the burst deleted after it may be a small share of a tree still
	// holding the versions it had yet to delete: once the burst is over,
	// it gets its pass on the count alone. Without this, ten minutes of
	// churn kept 52.8 MB of tables for 5.8 MB of live data.
	return c.midBurst && !burst && deletes-pending >= reclaimMinDeletes, busy
}

// reclaimed records that a reclamation completed after the last check.
func (c *reclaimChecks) reclaimed() { c.midBurst = c.bursting > 0 }

// lastCommitTs is badger's timestamp of the newest completed commit.
func (s *Store) lastCommitTs() uint64 {
	txn := s.db.NewTransaction(false)
	defer txn.Discard()
	return txn.ReadTs()
}

// flushedThrough reports whether every write up to badger timestamp ts is in
// a table: memtables are flushed in order, so one table holding a version at
// or above ts means the memtable with ts and all before it are flushed.
func (s *Store) flushedThrough(ts uint64) bool {
	for _, t := range s.db.Tables() {
		if t.MaxVersion >= ts {
			return true
		}
	}
	return false
}

// reclaimDue reports whether enough was deleted since the last reclamation.
func (s *Store) reclaimDue(deletes int64) bool {
	n := deletes - s.reclaim.pending.Load()
	if n < reclaimMinDeletes {
		return false
	}
	var keys int64
	for _, t := range s.db.Tables() {
		keys += int64(t.KeyCount)
	}
	// Deletes still in the memtable are not in any table yet; counting
	// them keeps the share meaningful when the tree is mostly memtable.
	return float64(n) >= reclaimShare*float64(keys+n)
}

// Reclaim is kv.Reclaimer (etcd's Defragment): now, whatever the deletes
// since the last run, it flushes the memtable, compacts the tree into its
// bottom level so that deleted keys stop taking disk space, and then runs
// value-log GC until a pass rewrites nothing, for the rare values too large
// for the tree. The store also drives the first two steps by itself after
// large deletes (runReclaim); an explicit call is what `etcdctl defrag`
// asks for.
//
// Commits pause only for the forced flush, which runs on the committer
// between two groups; reads and iterators go on throughout. Flatten cannot
// be interrupted: ctx is checked before the flush, before Flatten and
// between GC passes, and a Flatten under way runs to its end.
func (s *Store) Reclaim(ctx context.Context) error {
	if err := s.reclaimWith(ctx, true); err != nil {
		return err
	}
	return s.gcValueLog(ctx)
}

var _ kv.Reclaimer = (*Store)(nil)

// reclaim1 is the background loop's reclamation, with the memtable flush
// only if flush is set.
func (s *Store) reclaim1(flush bool) error {
	return s.reclaimWith(context.Background(), flush)
}

func (s *Store) reclaimWith(ctx context.Context, flush bool) error {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.usable(); err != nil {
		return err
	}
	s.reclaim.mu.Lock()
	defer s.reclaim.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	start := time.Now()
	s.reclaim.pending.Store(s.reclaim.deletes.Load())
	lsm0, vlog0 := s.db.Size()

	if flush {
		req := groupcommit.NewRequest(nil)
		req.Run = s.flushMemtable
		if err := s.queue.Submit(ctx, req); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
	flushed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return err
	}
	// One worker: the cores are shared with the server's requests.
	if err := s.db.Flatten(1); err != nil {
		return fmt.Errorf("badger: reclaim: flatten: %w", err)
	}
	s.reclaim.runs.Add(1)
	lsm1, vlog1 := s.db.Size()
	// badger's Size is refreshed by a background ticker, so these figures
	// can lag; they are for the log only.
	s.log.Info("reclaimed deleted space", "forced flush", flush, "flush", flushed.Round(time.Millisecond), "took", time.Since(start).Round(time.Millisecond),
		"size before", lsm0+vlog0, "size after", lsm1+vlog1)
	return nil
}

// gcValueLog runs value-log GC passes until one rewrites nothing. Values
// under the threshold live in the tree, so on most stores the first pass
// finds nothing; after Flatten dropped the keys of large deleted values,
// their value-log files can be rewritten or removed. An in-memory store has
// no value log.
func (s *Store) gcValueLog(ctx context.Context) error {
	if s.inMemory {
		return nil
	}
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.usable(); err != nil {
		return err
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := s.db.RunValueLogGC(defaultGCDiscardRatio)
		switch {
		case err == nil:
			// A file was rewritten: another may be worth it too.
		case errors.Is(err, badgerdb.ErrNoRewrite):
			return nil
		case errors.Is(err, badgerdb.ErrRejected):
			// The background GC is running a pass already; it goes on
			// until it has rewritten what it can.
			return nil
		default:
			return fmt.Errorf("badger: reclaim: value log GC: %w", err)
		}
	}
}

// flushMemtable runs on the committer goroutine (no write is in flight): it
// writes the marker and drops its prefix, which makes badger flush every
// memtable to a level-0 table and start a fresh memtable file.
func (s *Store) flushMemtable() error {
	txn := s.db.NewTransaction(true)
	defer txn.Discard()
	if err := txn.Set(reclaimMarker, nil); err != nil {
		return fmt.Errorf("badger: reclaim: marker: %w", err)
	}
	if err := txn.Commit(); err != nil {
		return fmt.Errorf("badger: reclaim: marker: %w", err)
	}
	if err := s.db.DropPrefix([]byte{reclaimPrefix}); err != nil {
		return fmt.Errorf("badger: reclaim: flush memtable: %w", err)
	}
	return nil
}
