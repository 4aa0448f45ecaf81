package badger

import (
	"context"
	"errors"
	"fmt"

	badgerdb "github.com/dgraph-io/badger/v3"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/condcache"
	"github.com/engramkv/engram/engines/internal/groupcommit"
)

// Commit applies ops atomically and durably. It returns after the group
// holding the batch has been fsynced.
func (s *Store) Commit(ctx context.Context, ops []kv.Op) error {
	if err := kv.ValidateBatch(ops); err != nil {
		return fmt.Errorf("badger: commit refused: %w", err)
	}
	req := groupcommit.NewRequest(ops)
	for i, op := range ops {
		if len(op.Key) > MaxKeySize {
			return fmt.Errorf("badger: commit refused: op %d: key of %d bytes exceeds the engine's limit of %d", i, len(op.Key), MaxKeySize)
		}
		if s.inMemory && len(op.Value) > MaxInMemoryValueSize {
			return fmt.Errorf("badger: commit refused: op %d: value of %d bytes exceeds the in-memory engine's limit of %d", i, len(op.Value), MaxInMemoryValueSize)
		}
		req.Size += s.entrySize(op)
		req.Count++
	}
	if req.Size >= s.maxTxnSize || req.Count >= s.maxTxnCount {
		return fmt.Errorf("badger: commit refused: batch of %d ops, ~%d bytes exceeds the engine's transaction limit (%d ops, %d bytes): %w: %w",
			req.Count, req.Size, s.maxTxnCount, s.maxTxnSize, kv.ErrBatchTooLarge, badgerdb.ErrTxnTooBig)
	}

	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.usable(); err != nil {
		return err
	}
	if len(ops) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("badger: commit not applied: %w", err)
	}
	s.noteDeletes(ops) // reclaim.go: what the core deleted drives reclamation
	return s.queue.Submit(ctx, req)
}

// entrySize mirrors badger's accounting of one write against its
// transaction limits (Txn.checkSize): key, value (or a value pointer for
// values in the value log), two meta bytes and ten for the version.
func (s *Store) entrySize(op kv.Op) int64 {
	k := int64(1 + len(op.Key))
	v := int64(len(op.Value))
	if op.Kind == kv.OpDelete || op.Kind == kv.OpCompareAndDelete {
		v = 0
	}
	if v >= s.valueThreshold {
		v = 12
	}
	return k + v + 2 + 10
}

// commitGroup applies the requests in order, cutting them into as many
// badger transactions as badger's size limits require. It is the
// committer, the only writer (groupcommit.Queue.Run calls it).
func (s *Store) commitGroup(group []*groupcommit.Request) {
	members := make([]*groupcommit.Request, 0, len(group))
	var size, count int64
	for _, r := range group {
		if !r.Take() {
			continue // its caller gave up before we got to it
		}
		if r.Run != nil {
			if len(members) > 0 {
				s.applyAndFlush(members)
				members, size, count = members[:0], 0, 0
			}
			r.Result = r.Run()
			r.Reply()
			continue
		}
		if len(members) > 0 && (size+r.Size >= s.maxTxnSize || count+r.Count >= s.maxTxnCount) {
			s.applyAndFlush(members)
			members, size, count = members[:0], 0, 0
		}
		members = append(members, r)
		size += r.Size
		count += r.Count
	}
	if len(members) > 0 {
		s.applyAndFlush(members)
	}
}

// applyAndFlush evaluates and applies members in one transaction, commits
// it and answers every member. A member whose writes badger refuses
// part-way would leave the transaction half-applied, so that member fails
// alone and the others are replayed in a fresh transaction; badger's limits
// are checked in advance, so this is a defence, not a path taken in
// practice.
func (s *Store) applyAndFlush(members []*groupcommit.Request) {
	for {
		failed := s.tryGroup(members)
		if failed < 0 {
			return
		}
		members[failed].Reply()
		members = append(members[:failed:failed], members[failed+1:]...)
		if len(members) == 0 {
			return
		}
	}
}

// tryGroup runs members through one transaction. It returns -1 when every
// member has been answered, or the index of a member whose writes were
// refused (its result set); the transaction is then discarded unanswered.
func (s *Store) tryGroup(members []*groupcommit.Request) int {
	txn := s.db.NewTransaction(true)
	defer txn.Discard()
	writes := 0
	for i, r := range members {
		r.Result = nil
		conflict, err := checkConditions(txn, r.Ops, s.conds)
		if err != nil {
			r.Result = fmt.Errorf("badger: commit not applied: %w", err)
			continue
		}
		if conflict != nil {
			r.Result = conflict
			continue
		}
		if err := applyOps(txn, r.Ops); err != nil {
			r.Result = fmt.Errorf("badger: commit not applied: %w", err)
			s.conds.Discard()
			return i
		}
		s.conds.Wrote(r.Ops)
		writes++
	}
	var err error
	if writes > 0 {
		err = txn.Commit()
	}
	s.conds.Settle(err == nil)
	s.stats.Answer(members, writes > 0, err, commitError)
	if err != nil {
		s.log.Error("group commit failed", "batches", len(members), "err", err)
	}
	return -1
}

// commitError classifies a failed badger commit. Errors badger returns
// before writing mean the batch was not applied; any later failure (a
// WAL write or fsync error) may have left the writes visible or durable,
// so the outcome is uncertain and the core must read back.
func commitError(err error) error {
	if errors.Is(err, badgerdb.ErrTxnTooBig) || errors.Is(err, badgerdb.ErrBlockedWrites) ||
		errors.Is(err, badgerdb.ErrDiscardedTxn) || errors.Is(err, badgerdb.ErrConflict) {
		return fmt.Errorf("badger: commit not applied: %w", err)
	}
	return fmt.Errorf("badger: commit: %w: %w", kv.ErrUncertain, err)
}

// checkConditions evaluates a batch's conditions in op order against txn,
// which holds the committed state plus the earlier batches of the group.
// Keys are distinct within a batch, so checking before applying any of the
// batch's own writes is exact.
//
// conds, when it proves a condition true from what the committer last wrote,
// saves the read; everything else is read from txn.
func checkConditions(txn *badgerdb.Txn, ops []kv.Op, conds *condcache.Cache) (*kv.ConflictError, error) {
	for i, op := range ops {
		if !op.Kind.Conditional() || conds.Holds(op) {
			continue
		}
		item, err := txn.Get(dataKey(op.Key))
		if errors.Is(err, badgerdb.ErrKeyNotFound) {
			if !op.Holds(nil, false) {
				return op.Conflict(i, nil, false), nil
			}
			continue
		} else if err != nil {
			return nil, fmt.Errorf("op %d: read %q: %w", i, op.Key, err)
		}
		// The value is compared in place; only a conflict copies it.
		var c *kv.ConflictError
		err = item.Value(func(v []byte) error {
			if !op.Holds(v, true) {
				c = op.Conflict(i, v, true)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("op %d: read %q: %w", i, op.Key, err)
		}
		if c != nil {
			return c, nil
		}
	}
	return nil, nil
}

// applyOps adds a batch's writes to txn. Badger keeps references to the
// key and value slices until the transaction commits; keys are fresh
// copies, and values belong to a caller blocked in Commit until then.
func applyOps(txn *badgerdb.Txn, ops []kv.Op) error {
	for i, op := range ops {
		var err error
		switch op.Kind {
		case kv.OpDelete, kv.OpCompareAndDelete:
			err = txn.Delete(dataKey(op.Key))
		default:
			v := op.Value
			if v == nil {
				v = []byte{} // badger would store nil and empty alike; be explicit
			}
			err = txn.Set(dataKey(op.Key), v)
		}
		if err != nil {
			return fmt.Errorf("op %d (%s %q): %w", i, op.Kind, op.Key, err)
		}
	}
	return nil
}
