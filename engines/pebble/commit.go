package pebble

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/condcache"
	"github.com/engramkv/engram/engines/internal/groupcommit"
)

// Commit applies ops atomically and durably. It returns after the group
// holding the batch has been fsynced.
func (s *Store) Commit(ctx context.Context, ops []kv.Op) error {
	if err := kv.ValidateBatch(ops); err != nil {
		return fmt.Errorf("pebble: commit refused: %w", err)
	}
	req := groupcommit.NewRequest(ops)
	for _, op := range ops {
		req.Size += int64(len(op.Key) + len(op.Value))
	}

	if err := s.gate.Enter(); err != nil {
		return err
	}
	defer s.gate.Exit()
	if len(ops) == 0 {
		return nil
	}
	return s.queue.Submit(ctx, req)
}

// committer is the state of the committer goroutine, which alone uses it.
type committer struct {
	s *Store
	// pending holds what the group's earlier batches wrote, which the
	// conditions of its later batches must see: the database does not hold
	// them until the group is applied. Values belong to callers blocked in
	// Commit until the group is answered.
	pending map[string]written
	members []*groupcommit.Request
	// conds proves conditions from what the committer last wrote.
	conds *condcache.Cache
	// iter reads the put-if-absent conditions of the group being evaluated
	// (readAbsent); nil until one needs it, and between groups.
	iter *pebbledb.Iterator
}

type written struct {
	value   []byte
	deleted bool
}

// commitGroup evaluates the requests in order, applies the batches whose
// conditions hold as one pebble batch, and answers every request. It is
// the committer, pebble's only writer (groupcommit.Queue.Run calls it).
func (c *committer) commitGroup(group []*groupcommit.Request) {
	s := c.s
	b := s.db.NewBatch()
	defer b.Close()
	clear(c.pending)
	c.members = c.members[:0]
	for _, r := range group {
		if !r.Take() {
			continue // its caller gave up before we got to it
		}
		c.members = append(c.members, r)
		conflict, err := c.checkConditions(r.Ops)
		switch {
		case err != nil:
			r.Result = fmt.Errorf("pebble: commit not applied: %w", err)
			continue
		case conflict != nil:
			r.Result = conflict
			continue
		}
		c.conds.Wrote(r.Ops)
		for _, op := range r.Ops {
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
	c.closeIter()
	var err error
	if !b.Empty() {
		// Pebble returns an error only before it writes anything (a
		// read-only or invalid batch); a failure to write or sync the WAL
		// is fatal to pebble (pebbleLogger.Fatalf), never an uncertain
		// outcome handed back.
		err = s.db.Apply(b, pebbledb.Sync)
	}
	c.conds.Settle(err == nil)
	s.stats.Answer(c.members, !b.Empty(), err, notApplied)
	if err != nil {
		s.log.Error("group commit failed", "batches", len(c.members), "err", err)
	}
	clear(c.pending) // drop the callers' values
	clear(c.members)
}

// notApplied is the result of a batch whose group pebble refused to write.
func notApplied(err error) error { return fmt.Errorf("pebble: commit not applied: %w", err) }

// checkConditions evaluates a batch's conditions in op order against the
// database plus the group's earlier batches. Keys are distinct within a
// batch, so checking before applying any of the batch's own writes is exact.
func (c *committer) checkConditions(ops []kv.Op) (*kv.ConflictError, error) {
	for i, op := range ops {
		if !op.Kind.Conditional() || c.conds.Holds(op) {
			continue
		}
		if w, ok := c.pending[string(op.Key)]; ok {
			if !op.Holds(w.value, !w.deleted) {
				return op.Conflict(i, w.value, !w.deleted), nil
			}
			continue
		}
		var conflict *kv.ConflictError
		found, err := c.read(op, func(v []byte) {
			// The value is compared in place; only a conflict copies it.
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

// read hands the committed value of op's key to use, which must not keep
// it; found is false when the key is absent.
func (c *committer) read(op kv.Op, use func(v []byte)) (found bool, err error) {
	if op.Kind == kv.OpPutIfAbsent {
		return c.readAbsent(op.Key, use)
	}
	// A compare names a key the core read and expects to exist, usually
	// written moments before: Get stops at the newest memtable or table
	// that holds it.
	v, closer, err := c.s.db.Get(op.Key)
	if errors.Is(err, pebbledb.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	use(v)
	return true, closer.Close()
}

// readAbsent is read for a key expected to be absent. It seeks an iterator
// by prefix rather than calling pebble's Get, because Get never consults the
// bloom filters of the bottom level, where most keys live: a key that does
// not exist (every create's put-if-absent) then costs an index and a data
// block read there (DESIGN.md, "The pebble engine"). One iterator serves the
// whole group: the committer is the only writer, so the database does not
// change until the group is applied, and the group's own writes are in
// pending.
func (c *committer) readAbsent(key []byte, use func(v []byte)) (found bool, err error) {
	if c.iter == nil {
		if c.iter, err = c.s.db.NewIter(&pebbledb.IterOptions{UseL6Filters: true}); err != nil {
			return false, err
		}
	}
	// The comparer's prefix of a key is the whole key, so the only key a
	// prefix seek can land on is key itself.
	if !c.iter.SeekPrefixGE(key) || !bytes.Equal(c.iter.Key(), key) {
		return false, c.iter.Error()
	}
	v, err := c.iter.ValueAndErr()
	if err != nil {
		return false, err
	}
	use(v)
	return true, nil
}

func (c *committer) closeIter() {
	if c.iter == nil {
		return
	}
	if err := c.iter.Close(); err != nil {
		c.s.log.Warn("closing the committer's iterator", "err", err)
	}
	c.iter = nil
}
