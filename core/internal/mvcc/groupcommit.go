package mvcc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/engramkv/engram/core/internal/retry"
	"github.com/engramkv/engram/core/kv"
)

// Group commit: one engine commit for every request of a group, then, in
// this order, the latest-record cache, the lessor, the watchers, and last
// the clock that makes the group's revisions readable. The committer
// (pipeline.go) runs it for one group at a time.

// commitGroup writes the group's batch (encoded by the writer), resolves an
// uncertain outcome, and publishes the result: lessor updates, events, then
// the clock.
func (b *Backend) commitGroup(g *group) error {
	ops := g.ops
	if len(ops) == 0 {
		return nil
	}
	var fenceKey []byte
	if b.fence != nil {
		op, err := b.fence()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrNotLeader, err)
		}
		fenceKey = op.Key
		ops = append(ops, op)
	}
	ctx := context.Background()
	unresolved := false
	if b.fence != nil && g.rev > g.baseRev {
		// Reads wait for this commit to settle (see readRevisions).
		inf := &inflightCommit{rev: g.rev, done: make(chan struct{})}
		b.inflight.Store(inf)
		defer func() {
			if unresolved {
				storeMax(&b.unresolved, g.rev)
			}
			b.inflight.CompareAndSwap(inf, nil)
			close(inf.done)
		}()
	}
	start := time.Now()
	err := b.store.Commit(ctx, ops)
	if b.metrics != nil {
		b.metrics.commitSeconds.Observe(time.Since(start).Seconds())
	}
	switch {
	case errors.Is(err, kv.ErrUncertain) && len(g.compaction) > 0:
		// Compaction's writes are idempotent and take no revision:
		// nothing later depends on knowing whether they landed, so the
		// compactor just does them again.
	case errors.Is(err, kv.ErrUncertain):
		unresolved, err = b.resolveUncertain(ctx, g, err)
	}
	start = time.Now()
	defer func() { g.publishSeconds = time.Since(start).Seconds() }()
	b.updateLatest(g, err == nil)
	if err != nil {
		if c, ok := kv.AsConflict(err); ok && fenceKey != nil && bytes.Equal(c.Key, fenceKey) {
			return fmt.Errorf("%w: another node took over (fenced)", ErrNotLeader)
		}
		if perr := g.presumedConflict(err); perr != nil {
			return perr
		}
		if c, ok := kv.AsConflict(err); ok {
			b.log.Error("store changed underneath the writer; write rejected", "key", fmt.Sprintf("%q", c.Key))
			return fmt.Errorf("%w: %w", ErrStoreConflict, err)
		}
		if errors.Is(err, kv.ErrBatchTooLarge) {
			return fmt.Errorf("%w (%d keys written in one revision): %w", ErrTooLarge, len(g.keys), err)
		}
		return storageErr("commit", err)
	}
	for _, fn := range g.after {
		fn()
	}
	if len(g.events) > 0 {
		if n := b.notifier.Load(); n != nil {
			n.n.Notify(g.rev, g.events)
		}
	}
	if g.rev > g.baseRev {
		b.clock.Advance(g.rev)
	}
	return nil
}

// inflightCommit is a commit the writer has sent to the engine and not yet
// published (or failed): rev is the revision it publishes, done closes
// once it is settled.
type inflightCommit struct {
	rev  int64
	done chan struct{}
}

// updateLatest brings the latest-record cache in line with the group's
// batch before its revision is published: the new records when it
// committed, nothing cached for its keys when it did not (or may not have).
func (b *Backend) updateLatest(g *group, committed bool) {
	if b.latest == nil {
		return
	}
	for k, s := range g.keys {
		switch {
		case !s.dirty:
		case committed && !s.deleteRevKey:
			b.latest.set(k, s.written)
		default:
			b.latest.invalidate(k)
		}
	}
}

// resolveUncertain decides, before anything later commits, whether a batch
// whose commit result was unknown was applied (see package retry for why
// this order keeps revisions dense and watch order intact, and
// (DESIGN.md, "Uncertain commits") for the alternatives). Its error is nil
// if the batch was applied and cause if it was not. Otherwise unresolved
// is set, with the error that ended the read-back: the backend closed, or
// the engine did, and this node will not learn the outcome.
func (b *Backend) resolveUncertain(ctx context.Context, g *group, cause error) (unresolved bool, err error) {
	key, present := g.witness()
	b.log.Warn("commit result uncertain; reading back", "err", cause)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-b.stopCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	err = retry.Resolve(ctx, b.store, retry.Witness{Key: key, Value: g.witnessValue, Removed: !present}, retry.Options{Logger: b.log})
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, retry.ErrNotApplied):
		return false, cause
	}
	return true, err
}
