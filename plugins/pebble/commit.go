package pebble

import (
	"context"
	"fmt"
	"sync/atomic"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/engramkv/engram/core/kv"
)

// Request states. A request is queued until the committer takes it or its
// caller gives up; exactly one of the two wins the compare-and-swap, so a
// caller that gave up knows its batch will never be applied.
const (
	reqQueued int32 = iota
	reqTaken
	reqAbandoned
)

type commitReq struct {
	ops   []kv.Op
	state atomic.Int32
	// size is the request's keys and values, which bound a group.
	size int64
	// result is set by the committer while it owns the request, then sent
	// on done.
	result error
	done   chan error
}

// Commit applies ops atomically and durably. It returns after the group
// holding the batch has been fsynced.
func (s *Store) Commit(ctx context.Context, ops []kv.Op) error {
	if err := kv.ValidateBatch(ops); err != nil {
		return fmt.Errorf("pebble: commit refused: %w", err)
	}
	req := &commitReq{ops: ops, done: make(chan error, 1)}
	for _, op := range ops {
		req.size += int64(len(op.Key) + len(op.Value))
	}

	s.gate.RLock()
	defer s.gate.RUnlock()
	if s.closed {
		return kv.ErrClosed
	}
	if len(ops) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pebble: commit not applied: %w", err)
	}
	select {
	case s.reqs <- req:
	case <-ctx.Done():
		return fmt.Errorf("pebble: commit not applied: %w", ctx.Err())
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		if req.state.CompareAndSwap(reqQueued, reqAbandoned) {
			return fmt.Errorf("pebble: commit not applied: %w", ctx.Err())
		}
		// The committer has the batch: its outcome is at most one group
		// write away. Waiting for it spares the caller an ErrUncertain to
		// resolve, and keeps the caller from reusing op buffers that the
		// committer is still reading.
		return <-req.done
	}
}

// runCommitter is the only writer. Each loop takes every request queued
// while the previous group was written and commits them as one group.
func (s *Store) runCommitter() {
	defer close(s.committerDone)
	c := &committer{s: s, pending: make(map[string]written)}
	group := make([]*commitReq, 0, maxGroup)
	for {
		r, ok := <-s.reqs
		if !ok {
			return
		}
		group = append(group[:0], r)
		size := r.size
	fill:
		for len(group) < maxGroup && size < maxGroupBytes {
			select {
			case r, ok := <-s.reqs:
				if !ok {
					break fill // closing: finish this group; the next receive ends the loop
				}
				group = append(group, r)
				size += r.size
			default:
				break fill
			}
		}
		c.commitGroup(group)
		clear(group)
	}
}

// committer is the state of the committer goroutine, which alone uses it.
type committer struct {
	s *Store
	// pending holds what the group's earlier batches wrote, which the
	// conditions of its later batches must see: the database does not hold
	// them until the group is applied. Values belong to callers blocked in
	// Commit until the group is answered.
	pending map[string]written
	members []*commitReq
}

type written struct {
	value   []byte
	deleted bool
}

// commitGroup evaluates the requests in order, applies the batches whose
// conditions hold as one pebble batch, and answers every request.
func (c *committer) commitGroup(group []*commitReq) {
	s := c.s
	b := s.db.NewBatch()
	defer b.Close()
	clear(c.pending)
	c.members = c.members[:0]
	for _, r := range group {
		if !r.state.CompareAndSwap(reqQueued, reqTaken) {
			continue // its caller gave up before we got to it
		}
		c.members = append(c.members, r)
		conflict, err := c.checkConditions(r.ops)
		switch {
		case err != nil:
			r.result = fmt.Errorf("pebble: commit not applied: %w", err)
			continue
		case conflict != nil:
			r.result = conflict
			continue
		}
		for _, op := range r.ops {
			// A batch that is not indexed cannot fail to take an op: Set
			// and Delete only append to its buffer.
			if op.Kind == kv.OpDelete || op.Kind == kv.OpCompareAndDelete {
				_ = b.Delete(op.Key, nil)
				c.pending[string(op.Key)] = written{deleted: true}
			} else {
				_ = b.Set(op.Key, op.Value, nil)
				c.pending[string(op.Key)] = written{value: op.Value}
			}
		}
	}
	var err error
	if !b.Empty() {
		// Pebble returns an error only before it writes anything (a
		// read-only or invalid batch); a failure to write or sync the WAL
		// is fatal to pebble (pebbleLogger.Fatalf), never an uncertain
		// outcome handed back.
		err = s.db.Apply(b, pebbledb.Sync)
		s.stats.groups.Add(1)
	}
	for _, r := range c.members {
		switch {
		case err != nil && (r.result == nil || isConflict(r.result)):
			// A conflict was judged against writes that did not land, so
			// it is void too; the batch simply was not applied.
			r.result = fmt.Errorf("pebble: commit not applied: %w", err)
		case r.result == nil:
			s.stats.batches.Add(1)
		case isConflict(r.result):
			s.stats.conflicts.Add(1)
		}
		r.done <- r.result
	}
	if err != nil {
		s.log.Error("group commit failed", "batches", len(c.members), "err", err)
	}
	clear(c.pending) // drop the callers' values
	clear(c.members)
}

func isConflict(err error) bool {
	_, ok := kv.AsConflict(err)
	return ok
}

// checkConditions evaluates a batch's conditions in op order against the
// database plus the group's earlier batches. Keys are distinct within a
// batch, so checking before applying any of the batch's own writes is exact.
func (c *committer) checkConditions(ops []kv.Op) (*kv.ConflictError, error) {
	for i, op := range ops {
		if !op.Kind.Conditional() {
			continue
		}
		if w, ok := c.pending[string(op.Key)]; ok {
			if !op.Holds(w.value, !w.deleted) {
				return op.Conflict(i, w.value, !w.deleted), nil
			}
			continue
		}
		var conflict *kv.ConflictError
		// The value is compared in place; only a conflict copies it.
		found, err := c.s.lookup(op.Key, func(v []byte) {
			if !op.Holds(v, true) {
				conflict = op.Conflict(i, v, true)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("op %d: read %q: %w", i, op.Key, err)
		}
		if !found && !op.Holds(nil, false) {
			conflict = op.Conflict(i, nil, false)
		}
		if conflict != nil {
			return conflict, nil
		}
	}
	return nil, nil
}
