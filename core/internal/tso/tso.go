// Package tso is Engram's revision clock: the one global int64 revision that
// orders every change, as etcd's main revision does.
//
// Invariants:
//   - A fresh store is at revision 1; the first write gets revision 2.
//   - Each successful write transaction takes exactly the next revision, so
//     revisions are dense: there is no gap and none is ever reused.
//   - The clock never goes backwards, including across restarts: Recover reads
//     the highest revision in the store's change log, which every write
//     transaction appends to in the same atomic batch as its data.
//
// The clock does not decide when a revision is durable; the MVCC writer
// allocates revisions, commits them, and only then publishes them with
// Advance, so readers never see a revision whose data is not in the store.
package tso

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// FirstRevision is the revision of an empty store, as in etcd.
const FirstRevision = 1

// Clock holds the latest published revision.
type Clock struct {
	rev atomic.Int64
}

// New returns a clock at rev.
func New(rev int64) *Clock {
	c := &Clock{}
	c.rev.Store(rev)
	return c
}

// Current returns the latest published revision: every write at or below it
// is durable and visible to reads.
func (c *Clock) Current() int64 { return c.rev.Load() }

// Advance publishes rev. It panics if rev would move the clock backwards,
// since that would break every reader's and watcher's assumptions.
func (c *Clock) Advance(rev int64) {
	for {
		cur := c.rev.Load()
		if rev < cur {
			panic(fmt.Sprintf("tso: revision moving backwards from %d to %d", cur, rev))
		}
		if c.rev.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// Recover returns the highest committed revision in store: the revision of the
// last change-log record, or FirstRevision for an empty store.
func Recover(ctx context.Context, store kv.Store) (int64, error) {
	it, err := store.Scan(ctx, kv.ScanOptions{
		Start:   coder.Prefix(coder.SpaceEvent),
		End:     coder.SpaceEnd(coder.SpaceEvent),
		Reverse: true,
		Limit:   1,
	})
	if err != nil {
		return 0, fmt.Errorf("tso: scan change log: %w", err)
	}
	defer it.Close()
	batch, err := it.Next(ctx)
	if err != nil {
		return 0, fmt.Errorf("tso: scan change log: %w", err)
	}
	if len(batch) == 0 {
		return FirstRevision, nil
	}
	rev, err := coder.DecodeEventKey(batch[0].Key)
	if err != nil {
		return 0, fmt.Errorf("tso: last change-log key: %w", err)
	}
	if rev < FirstRevision {
		return 0, fmt.Errorf("tso: change log holds revision %d below %d", rev, FirstRevision)
	}
	return rev, nil
}
