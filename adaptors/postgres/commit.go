package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/engramkv/engram/sdk"
)

// errRaced is a failed condition whose key changed back before its current
// value was read, so the conflict cannot be reported faithfully; the batch
// is retried.
var errRaced = errors.New("a failed condition's key changed again before it was read")

// commitAttempts bounds the retries of a batch the server aborted as a
// deadlock or serialization failure (which roll everything back).
const commitAttempts = 5

// Commit applies ops in one transaction. See commitOnce for the steps and
// classifyCommit for what each failure means.
func (s *store) Commit(ctx context.Context, ops []sdk.Op) error {
	// Statements run in key order: two batches that touch the same rows
	// lock them in the same order, so Engram's own concurrent commits
	// cannot deadlock each other. Results are mapped back to op indexes.
	order := make([]int, len(ops))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return bytes.Compare(ops[a].Key, ops[b].Key) })
	var err error
	for attempt := 1; ; attempt++ {
		err = s.commitOnce(ctx, ops, order)
		if err == nil || !(retryable(err) || errors.Is(err, errRaced)) || attempt == commitAttempts {
			break
		}
		if d, ok := ctx.Deadline(); ok && time.Now().After(d) {
			break
		}
	}
	if errors.Is(err, errRaced) {
		// Still racing after every attempt: the key keeps flipping. Nothing
		// was applied.
		return fmt.Errorf("commit: %w: %w", sdk.ErrUnavailable, err)
	}
	if err == nil {
		return nil
	}
	var ce *sdk.ConflictError
	if errors.As(err, &ce) || errors.Is(err, sdk.ErrUncertain) {
		return err
	}
	return fmt.Errorf("commit: %w", classify(err))
}

// commitOnce runs one attempt:
//
//  1. one pipelined round trip: BEGIN ISOLATION LEVEL READ COMMITTED, then
//     every op's statement. READ COMMITTED is enough because every
//     condition is checked by the write on the same row, which locks the
//     row (or, for an absent key, the unique index slot) until the end of
//     the transaction and re-checks the condition against the newest
//     committed version: the batch is serialised at its COMMIT.
//  2. if an op's condition failed (0 rows affected), read the current value
//     of the lowest-index failing key and ROLLBACK, in one round trip;
//  3. otherwise COMMIT.
func (s *store) commitOnce(ctx context.Context, ops []sdk.Op, order []int) error {
	c, err := s.pool.get(ctx)
	if err != nil {
		return err
	}
	// put discards the connection if it is broken or still in a
	// transaction.
	defer s.pool.put(c)
	qctx := queryContext(ctx)

	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`)
	for _, i := range order {
		op := &ops[i]
		switch op.Kind {
		case sdk.OpPut:
			b.Queue(s.sql.put, op.Key, nonNil(op.Value))
		case sdk.OpDelete:
			b.Queue(s.sql.del, op.Key)
		case sdk.OpPutIfAbsent:
			b.Queue(s.sql.putNew, op.Key, nonNil(op.Value))
		case sdk.OpCompareAndSwap:
			b.Queue(s.sql.cas, op.Key, nonNil(op.Value), nonNil(op.Expected))
		case sdk.OpCompareAndDelete:
			b.Queue(s.sql.cad, op.Key, nonNil(op.Expected))
		default:
			return fmt.Errorf("%w: op %d: unknown kind %d", sdk.ErrInvalid, i, op.Kind)
		}
	}
	br := c.SendBatch(qctx, b)
	failed := -1 // lowest index whose condition failed
	var execErr error
	if _, err := br.Exec(); err != nil {
		execErr = err
	}
	for _, i := range order {
		if execErr != nil {
			break
		}
		tag, err := br.Exec()
		if err != nil {
			execErr = err
			break
		}
		if ops[i].Kind != sdk.OpPut && ops[i].Kind != sdk.OpDelete && tag.RowsAffected() != 1 && (failed < 0 || i < failed) {
			failed = i
		}
	}
	if err := br.Close(); err != nil && execErr == nil {
		execErr = err
	}
	if execErr != nil {
		// COMMIT was never sent: nothing is applied. put closes the
		// connection if the failed transaction is still open on it.
		s.rollback(c)
		return execErr
	}
	if failed >= 0 {
		return s.conflict(qctx, c, ops, failed)
	}

	if c.IsClosed() || c.PgConn().TxStatus() != 'T' {
		// Checked here, not inferred from COMMIT's error: nothing has
		// been sent yet, so nothing was applied.
		return fmt.Errorf("%w: connection lost before COMMIT", sdk.ErrUnavailable)
	}
	tag, err := simpleExec(qctx, c, `COMMIT`)
	if err != nil {
		return classifyCommit(err)
	}
	if tag.String() != "COMMIT" {
		// The server answers ROLLBACK to a COMMIT of an aborted
		// transaction; it cannot be aborted here, but never report it as
		// applied.
		return fmt.Errorf("COMMIT answered %q: the transaction was rolled back", tag.String())
	}
	return nil
}

// conflict reads the current value of ops[index]'s key and rolls back, in
// one round trip. Under READ COMMITTED the read sees the newest committed
// version, the one the condition was checked against or a later one.
func (s *store) conflict(qctx context.Context, c *pgx.Conn, ops []sdk.Op, index int) error {
	b := &pgx.Batch{}
	b.Queue(s.sql.get, ops[index].Key)
	b.Queue(`ROLLBACK`)
	br := c.SendBatch(qctx, b)
	var cur []byte
	err := br.QueryRow().Scan(&cur)
	exists := err == nil
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if _, rerr := br.Exec(); err == nil {
		err = rerr
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// The batch was not applied either way: the transaction never
		// committed.
		s.rollback(c)
		return fmt.Errorf("reading the conflicting key of op %d: %w", index, err)
	}
	op := &ops[index]
	holds := false
	switch op.Kind {
	case sdk.OpPutIfAbsent:
		holds = !exists
	case sdk.OpCompareAndSwap, sdk.OpCompareAndDelete:
		holds = exists && bytes.Equal(cur, op.Expected)
	}
	if holds {
		return errRaced
	}
	return &sdk.ConflictError{Index: index, Exists: exists, Current: cur}
}

// rollback ends a failed transaction on a connection that is still open,
// so it can be reused; put discards it if that fails.
func (s *store) rollback(c *pgx.Conn) {
	if c.IsClosed() || c.PgConn().TxStatus() == 'I' {
		return
	}
	_, _ = simpleExec(context.Background(), c, `ROLLBACK`)
}

// classifyCommit maps an error of the COMMIT statement, once sent. Only a
// server answer that says the transaction was rolled back is certain: a
// transaction rollback (40xxx: serialization failure, deadlock; Commit
// retries those), a deferred constraint violation (23xxx), an invalid
// transaction state (25xxx). Anything else (the connection lost, a
// timeout while waiting for the answer, the server shutting down in the
// middle) leaves the outcome unknown. The driver's own "safe to retry"
// verdict is not used: pgx reports a connection it found closed while
// reading COMMIT's answer as safe to retry, although COMMIT was sent and
// applied (host/postgres_test.go, CommitCuts, caught this).
func classifyCommit(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && len(pe.Code) == 5 {
		switch pe.Code[:2] {
		case "40", "23", "25":
			return err
		}
	}
	return fmt.Errorf("%w: COMMIT sent, outcome unknown: %v", sdk.ErrUncertain, err)
}
