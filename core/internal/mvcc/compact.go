package mvcc

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// Compaction has two steps, as in etcd:
//
// Every engine write of both steps goes through the writer with the leader's
// fence (commitCompaction), so a deposed leader still inside its lease can
// neither move the stored compacted revision nor delete history the new
// leader serves.
//
//  1. Logical: Compact records the compacted revision C durably and at once;
//     from then on reads and watches below C fail with ErrCompacted.
//  2. Physical: a background loop removes what no read at or above C can
//     observe. It is driven by the change log, so its cost is proportional to
//     the changes since the last compaction, not to the size of the store:
//     - for each key changed in [previous, C]: if its latest version (in the
//     revision key) is at or below C, every history version at or below C;
//     otherwise every history version at or below C but the newest one
//     (what a read at C returns), and that one too if it is a tombstone;
//     - revision keys holding tombstones at or below C (through the writer,
//     so it never races a re-create of the key);
//     - change-log records below C.
//     It waits until no read is pinned below C, and persists its progress, so
//     a restart resumes it.
//
// As in etcd, the previous version of an event at exactly C is below C, so
// such an event has no prev_kv; the watch hub enforces that for events it
// still holds in memory.
//
// Why this rule, and what it costs: (DESIGN.md, "Compaction's rule").

const compactChunk = 512

// Compact compacts the history below rev. It returns the current revision.
// With wait, it returns once the physical compaction has finished.
func (b *Backend) Compact(ctx context.Context, rev int64, wait bool) (int64, error) {
	if b.readOnly {
		return 0, ErrNotLeader
	}
	b.compactMu.Lock()
	cur := b.clock.Current()
	if rev <= b.compactFloor() {
		b.compactMu.Unlock()
		return cur, ErrCompacted
	}
	if rev > cur {
		b.compactMu.Unlock()
		return cur, ErrFutureRev
	}
	if err := b.commitCompaction(ctx, []kv.Op{kv.Put(coder.MetaKey(metaCompact), compactRecord(rev, b.physical.Load()))}); err != nil {
		b.compactMu.Unlock()
		if isStorageFailure(err) {
			return cur, err
		}
		return cur, storageErr("persist compacted revision", err)
	}
	b.compactRev.Store(rev)
	b.compacted.Store(true)
	b.compactMu.Unlock()
	b.counts.dropBelow(rev)
	b.kickCompaction()
	if wait {
		for b.physical.Load() < rev {
			select {
			case <-ctx.Done():
				return cur, ctx.Err()
			case <-b.stopCh:
				return cur, ErrClosed
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return cur, nil
}

// compactFloor is the revision at or below which Compact answers
// ErrCompacted. As in etcd (mvcc's store starts its compacted revision at
// -1), a store never compacted accepts Compact(0) and refuses only negative
// revisions; once compacted at C, C and below are refused, so a repeated
// Compact(0) is refused too. The stored mark is what tells the two apart,
// before and after a restart.
func (b *Backend) compactFloor() int64 {
	if !b.compacted.Load() {
		return -1
	}
	return b.compactRev.Load()
}

func compactRecord(logical, physical int64) []byte {
	v := binary.BigEndian.AppendUint64(nil, uint64(logical))
	return binary.BigEndian.AppendUint64(v, uint64(physical))
}

// commitCompaction commits compaction's engine writes through the writer,
// with the leader's fence: a deposed leader can neither move the compacted
// revision nor delete history the new leader serves.
func (b *Backend) commitCompaction(ctx context.Context, ops []kv.Op) error {
	if len(ops) == 0 {
		return nil
	}
	_, err := b.submit(ctx, &request{kind: reqCompaction, ops: ops})
	return err
}

func (b *Backend) kickCompaction() {
	select {
	case b.compactReq <- struct{}{}:
	default:
	}
}

func (b *Backend) compactLoop() {
	defer b.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-b.stopCh
		cancel()
	}()
	for {
		select {
		case <-b.stopCh:
			return
		case <-b.compactReq:
		}
		for {
			target := b.compactRev.Load()
			from := b.physical.Load()
			if from >= target {
				break
			}
			if err := b.compactPhysical(ctx, from, target); err != nil {
				if ctx.Err() != nil {
					return
				}
				b.log.Warn("physical compaction failed; retrying", "target", target, "err", err)
				select {
				case <-time.After(time.Second):
				case <-b.stopCh:
					return
				}
				continue
			}
		}
	}
}

func (b *Backend) compactPhysical(ctx context.Context, from, target int64) error {
	start := time.Now()
	for b.pinnedBelow(target) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	// Keys changed in [from, target], each once.
	seen := map[string]struct{}{}
	var keys [][]byte
	err := kv.ScanEach(ctx, b.store, kv.ScanOptions{Start: coder.EventKey(from), End: coder.EventKey(target + 1), BatchSize: 512}, func(p kv.Pair) error {
		cs, err := decodeChanges(p.Value)
		if err != nil {
			return err
		}
		for _, c := range cs {
			if _, ok := seen[string(c.Key)]; !ok {
				seen[string(c.Key)] = struct{}{}
				keys = append(keys, append([]byte(nil), c.Key...))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	var dels []kv.Op
	var tombstones [][]byte
	flush := func() error {
		if len(dels) == 0 {
			return nil
		}
		err := b.commitCompaction(ctx, dels)
		dels = nil
		return err
	}
	for _, k := range keys {
		var versions []kv.Pair
		s, e := coder.ObjectVersions(k, 0, target)
		if err := kv.ScanEach(ctx, b.store, kv.ScanOptions{Start: s, End: e}, func(p kv.Pair) error {
			versions = append(versions, p)
			return nil
		}); err != nil {
			return err
		}
		// Read the latest version after history: a concurrent write only
		// moves a version into history that this scan did not see, and
		// that one stays.
		latest, err := b.store.Get(ctx, coder.RevisionKey(k))
		switch {
		case errors.Is(err, kv.ErrNotFound):
			latest = nil
		case err != nil:
			return err
		}
		var lh Version
		if latest != nil {
			if lh, _, err = decodeHeader(latest); err != nil {
				return err
			}
		}
		drop := versions
		if latest != nil && lh.ModRev > target {
			// History holds what a read at target returns: keep the newest
			// version at or below target unless it says "deleted".
			if n := len(versions); n > 0 {
				h, _, err := decodeHeader(versions[n-1].Value)
				if err != nil {
					return err
				}
				if !h.Tombstone {
					drop = versions[:n-1]
				}
			}
		} else if latest != nil && lh.Tombstone {
			tombstones = append(tombstones, k)
		}
		// With no revision key left (its tombstone went at an earlier
		// compaction) the key reads as absent at every revision from here
		// on, so all its history at or below target goes.
		for _, v := range drop {
			dels = append(dels, kv.Delete(v.Key))
		}
		if len(dels) >= compactChunk {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	for len(tombstones) > 0 {
		n := min(len(tombstones), compactChunk)
		if _, err := b.submit(ctx, &request{kind: reqCleanTombstones, keys: tombstones[:n], below: target + 1}); err != nil {
			return err
		}
		tombstones = tombstones[n:]
	}
	// The change log below target goes last: until it is gone, a crash
	// makes the next run find the same keys again.
	for rev := from; rev < target; {
		end := min(rev+compactChunk, target)
		var ops []kv.Op
		if err := kv.ScanEach(ctx, b.store, kv.ScanOptions{Start: coder.EventKey(rev), End: coder.EventKey(end)}, func(p kv.Pair) error {
			ops = append(ops, kv.Delete(p.Key))
			return nil
		}); err != nil {
			return err
		}
		if err := b.commitCompaction(ctx, ops); err != nil {
			return err
		}
		rev = end
	}
	b.compactMu.Lock()
	err = b.commitCompaction(ctx, []kv.Op{kv.Put(coder.MetaKey(metaCompact), compactRecord(b.compactRev.Load(), target))})
	b.compactMu.Unlock()
	if err != nil {
		return err
	}
	b.physical.Store(target)
	if b.metrics != nil {
		b.metrics.compactions.Inc()
	}
	b.log.Debug("physical compaction done", "from", from, "to", target, "keys", len(keys), "took", time.Since(start))
	return nil
}

// cleanTombstones removes the revision keys of keys whose latest version is a
// tombstone older than below: compaction has made them unobservable.
func (g *group) cleanTombstones(keys [][]byte, below int64) error {
	for _, k := range keys {
		s, err := g.state(k)
		if err != nil {
			return err
		}
		if s.exists && s.cur.Tombstone && s.cur.ModRev < below && !s.dirty {
			s.exists, s.dirty, s.deleteRevKey = false, true, true
		}
	}
	return nil
}
