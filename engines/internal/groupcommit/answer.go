package groupcommit

import (
	"sync/atomic"

	"github.com/engramkv/engram/core/kv"
)

// Stats counts the work of a committer since its store opened.
type Stats struct {
	// Batches is the number of batches applied (conflicting ones excluded).
	Batches uint64
	// Groups is the number of groups written to the engine (a badger
	// transaction, a pebble batch), each one WAL write and one fsync.
	// Batches/Groups is the group-commit factor.
	Groups uint64
	// Conflicts is the number of batches refused with a *kv.ConflictError.
	Conflicts uint64
}

// Counters are a committer's counts behind Stats. Only the committer adds
// to them; Stats may be read at any time.
type Counters struct {
	batches, groups, conflicts atomic.Uint64
}

// Stats returns the counts so far.
func (c *Counters) Stats() Stats {
	return Stats{
		Batches:   c.batches.Load(),
		Groups:    c.groups.Load(),
		Conflicts: c.conflicts.Load(),
	}
}

// Batches is Stats().Batches alone.
func (c *Counters) Batches() uint64 { return c.batches.Load() }

// Answer settles and answers the members of a group after the committer
// wrote the batches it judged applicable (wrote reports whether it wrote
// anything; err is the write's error). When the write failed, a batch
// judged applicable was not applied, and neither stands a conflict judged
// against writes that did not land: both get failed(err), the engine's
// classification of its error. It counts what it answers.
func (c *Counters) Answer(members []*Request, wrote bool, err error, failed func(error) error) {
	if wrote {
		c.groups.Add(1)
	}
	for _, r := range members {
		_, conflict := kv.AsConflict(r.Result)
		switch {
		case err != nil && (r.Result == nil || conflict):
			r.Result = failed(err)
		case r.Result == nil:
			c.batches.Add(1)
		case conflict:
			c.conflicts.Add(1)
		}
		r.Reply()
	}
}
