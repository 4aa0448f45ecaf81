package tikv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	tikverr "github.com/tikv/client-go/v2/error"
	tikvclient "github.com/tikv/client-go/v2/tikv"
	"github.com/tikv/client-go/v2/txnkv/transaction"

	"github.com/engramkv/engram/core/kv"
)

const (
	// maxCommitAttempts bounds how often one Commit re-runs its batch
	// after TiKV reported a write conflict. A batch with conditions
	// usually ends on the second attempt (the re-check fails and reports
	// a *kv.ConflictError); only blind writes racing other writers of
	// the same keys need more.
	maxCommitAttempts = 16
	retryBaseDelay    = 2 * time.Millisecond
	retryMaxDelay     = 200 * time.Millisecond
)

// mutation is one op with its key in the namespace and its value framed,
// computed once for all attempts.
type mutation struct {
	key   []byte
	value []byte // nil for deletes
}

// errClass is what a failed transaction attempt means for the batch.
type errClass int

const (
	// notApplied: the batch was certainly not applied; a plain error.
	notApplied errClass = iota
	// retry: not applied, and running the batch again on a fresh
	// snapshot may succeed (a write conflict).
	retry
	// uncertain: the batch may or may not have been applied.
	uncertain
)

func (c errClass) String() string {
	switch c {
	case notApplied:
		return "not applied"
	case retry:
		return "retry"
	case uncertain:
		return "uncertain"
	}
	return fmt.Sprintf("errClass(%d)", int(c))
}

// classify maps an error of a transaction attempt. commitPhase reports
// whether the committer had prewritten every key and was about to send (or
// had sent) the commit of the primary key; see commitOnce for how that is
// observed. The mapping rests on how client-go v2.0.4 runs an optimistic
// transaction with plain two-phase commit (async commit and 1PC off):
//
//   - Prewrite locks every key. A failed or abandoned prewrite leaves at
//     most locks whose primary never commits, and TiKV resolves such locks
//     by rolling them back, never forward. So every error before the
//     commit phase means "not applied".
//   - The transaction commits at exactly one point: when TiKV commits the
//     primary key. Once that request may have been sent, only TiKV's
//     answer tells, and every error without one is uncertain.
//
// Error by error (the first matching line wins):
//
//	error                                       phase       class
//	tikverr.ErrResultUndetermined               any         uncertain   an RPC carrying the primary's commit failed without an answer (response lost, connection reset, TiKV timeout)
//	anything                                    commit      uncertain   region errors until the backoff budget ran out, context deadline or cancellation, PD unreachable while renewing an expired commit ts, "txn not found" after the lock was resolved: TiKV may have committed an earlier attempt of the same request
//	*tikverr.ErrWriteConflict                   prewrite    retry       another transaction committed one of our keys after our start ts (or holds it locked and committed first); the conditions must be re-read
//	*tikverr.ErrWriteConflictInLatch            before      retry       the same, detected by client-go's local latches
//	*tikverr.ErrRetryable                       prewrite    retry       TiKV asks for the transaction to be retried
//	context.DeadlineExceeded / Canceled         before      not applied the caller gave up before the commit point
//	region unavailable, server busy, PD timeout before      not applied client-go's backoff budget ran out while prewriting or fetching a timestamp
//	ErrAssertionFailed, ErrTxnTooLarge, key too large, ErrGCTooEarly ...
//	                                            before      not applied TiKV refused the prewrite outright
//
// Treating every commit-phase failure as uncertain is deliberately
// conservative: some of them (a "txn not found" key error on the primary)
// do mean "not applied", but telling them apart means matching client-go's
// unexported error strings, and an uncertain verdict only costs the core a
// read-back.
func classify(err error, commitPhase bool) errClass {
	var latch *tikverr.ErrWriteConflictInLatch
	var retryable *tikverr.ErrRetryable
	switch {
	case errors.Is(err, tikverr.ErrResultUndetermined):
		return uncertain
	case commitPhase:
		return uncertain
	case tikverr.IsErrWriteConflict(err), errors.As(err, &latch), errors.As(err, &retryable):
		return retry
	default:
		return notApplied
	}
}

// Commit applies ops atomically in one TiKV transaction, re-running it
// after write conflicts; see the package documentation and classify.
func (s *Store) Commit(ctx context.Context, ops []kv.Op) error {
	if err := kv.ValidateBatch(ops); err != nil {
		return fmt.Errorf("tikv: commit refused: %w", err)
	}
	if err := s.gate.Enter(); err != nil {
		return err
	}
	defer s.gate.Exit()
	if len(ops) == 0 {
		return nil
	}
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()

	muts := make([]mutation, len(ops))
	for i, op := range ops {
		muts[i].key = s.dataKey(op.Key)
		if op.Kind != kv.OpDelete && op.Kind != kv.OpCompareAndDelete {
			muts[i].value = encodeValue(op.Value)
		}
	}
	delay := retryBaseDelay
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("tikv: commit not applied: %w", err)
		}
		commitPhase, err := s.commitOnce(ctx, ops, muts)
		if err == nil {
			s.stats.commits.Add(1)
			return nil
		}
		if c, ok := kv.AsConflict(err); ok {
			s.stats.conflicts.Add(1)
			return c
		}
		switch classify(err, commitPhase) {
		case uncertain:
			s.stats.uncertain.Add(1)
			s.log.Warn("commit result uncertain", "ops", len(ops), "attempt", attempt, "err", err)
			return fmt.Errorf("tikv: commit: %w: %w", kv.ErrUncertain, withCtx(ctx, err))
		case notApplied:
			return fmt.Errorf("tikv: commit not applied: %w", withCtx(ctx, err))
		}
		if attempt == maxCommitAttempts {
			return fmt.Errorf("tikv: commit not applied: still conflicting after %d attempts: %w", attempt, err)
		}
		s.stats.retries.Add(1)
		s.log.Debug("write conflict; re-running the batch", "ops", len(ops), "attempt", attempt, "err", err)
		// Jittered exponential backoff: writers that keep colliding on
		// a key spread out instead of colliding again in lockstep.
		wait := delay/2 + rand.N(delay/2+1)
		delay = min(2*delay, retryMaxDelay)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("tikv: commit not applied: %w (after a write conflict: %v)", ctx.Err(), err)
		}
	}
}

// commitOnce runs the batch as one optimistic transaction at a fresh
// start timestamp. It returns a *kv.ConflictError when a condition fails,
// and reports whether a failure happened in the commit phase.
func (s *Store) commitOnce(ctx context.Context, ops []kv.Op, muts []mutation) (commitPhase bool, err error) {
	ts, err := s.timestamp(ctx)
	if err != nil {
		return false, err
	}
	txn, err := s.kvs.Begin(tikvclient.WithStartTS(ts))
	if err != nil {
		return false, fmt.Errorf("begin transaction: %w", err)
	}
	// classify relies on plain 2PC, where the primary key's commit is the
	// single commit point. Both are off by default; say so explicitly.
	txn.SetEnableAsyncCommit(false)
	txn.SetEnable1PC(false)
	// client-go calls this hook after prewrite succeeded and a commit
	// timestamp was obtained, right before it commits the primary key:
	// the one public observation point of "the commit may now happen".
	var reached atomic.Bool
	txn.SetCommitTSUpperBoundCheck(func(uint64) bool {
		reached.Store(true)
		return true
	})

	conflict, err := checkConditions(ctx, txn, ops, muts)
	if err != nil || conflict != nil {
		_ = txn.Rollback() // nothing was sent to TiKV; this only drops the buffer
		if err != nil {
			return false, err
		}
		return false, conflict
	}
	for i, m := range muts {
		if m.value == nil {
			err = txn.Delete(m.key)
		} else {
			err = txn.Set(m.key, m.value)
		}
		if err != nil {
			_ = txn.Rollback()
			return false, fmt.Errorf("op %d (%s %q): %w", i, ops[i].Kind, ops[i].Key, err)
		}
	}
	err = txn.Commit(ctx)
	return reached.Load(), err
}

// checkConditions reads the keys of the conditional ops at the
// transaction's start timestamp and checks them in op order. Keys are
// distinct within a batch, so checking before any of the batch's writes is
// exact. Each such key is also written by the batch, so if it changes
// before the commit TiKV reports a write conflict and the batch re-runs.
func checkConditions(ctx context.Context, txn *transaction.KVTxn, ops []kv.Op, muts []mutation) (*kv.ConflictError, error) {
	var keys [][]byte
	for i, op := range ops {
		if op.Kind.Conditional() {
			keys = append(keys, muts[i].key)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	current, err := txn.BatchGet(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("read %d condition keys: %w", len(keys), err)
	}
	for i, op := range ops {
		if !op.Kind.Conditional() {
			continue
		}
		raw, exists := current[string(muts[i].key)]
		var v []byte
		if exists {
			if v, err = decodeValue(raw); err != nil {
				return nil, fmt.Errorf("op %d: read %q: %w", i, op.Key, err)
			}
		}
		if !op.Holds(v, exists) {
			return op.Conflict(i, v, exists), nil
		}
	}
	return nil, nil
}
