package main

import (
	"bytes"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/engramkv/engram/sdk"
)

// errRaced is a failed condition whose key changed back before its current
// value was read, so the conflict cannot be reported faithfully; the batch
// is retried.
var errRaced = errors.New("a failed condition's key changed again before it was read")

// errStale marks a commit whose connection had died while idle; see
// commitOnce.
var errStale = errors.New("the pooled connection had been closed")

// commitAttempts bounds the retries of a batch the server aborted as a
// deadlock or lock wait timeout.
const commitAttempts = 5

// beginCommit starts a commit's transaction. READ COMMITTED is enough
// because every condition is checked by the write on the same row, which
// locks the row (or, for INSERT IGNORE of an absent key, the new record)
// until the end of the transaction and re-checks the condition against the
// newest committed version: the batch is serialised at its COMMIT. It also
// spares the gap locks REPEATABLE READ takes for writes of absent keys,
// which deadlock batches that touch neighbouring keys.
const beginCommit = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED;START TRANSACTION"

// beginStatements is how many results beginCommit yields.
const beginStatements = 2

// Commit applies ops in one transaction. See commitOnce for the steps and
// classifyCommit for what each failure means.
func (s *store) Commit(ctx context.Context, ops []sdk.Op) error {
	for i := range ops {
		if len(ops[i].Key) > maxKeyLen {
			return fmt.Errorf("%w: op %d: key of %d bytes (at most %d)", sdk.ErrInvalid, i, len(ops[i].Key), maxKeyLen)
		}
	}
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
		if errors.Is(err, errStale) {
			// Not an attempt: the connection had died while idle, and
			// nothing reached the server.
			attempt--
			continue
		}
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
//  1. one round trip (more only if the statements exceed the server's
//     max_allowed_packet): beginCommit, then every op's statement, in key
//     order; each statement's affected-row count says whether its
//     condition held;
//  2. if one failed, read the current value of the lowest-index failing
//     key and ROLLBACK, in one round trip;
//  3. otherwise COMMIT, alone in its round trip: everything before it
//     failing means nothing was applied.
//
// A connection that had died while idle in the pool fails the first round
// trip with errStale: nothing reached the server, and Commit runs the
// attempt again on a new connection.
func (s *store) commitOnce(ctx context.Context, ops []sdk.Op, order []int) error {
	c, err := s.pool.get(ctx)
	if err != nil {
		return err
	}
	// put discards the connection if it is broken or still in a
	// transaction.
	defer s.pool.put(c)

	limit := s.maxPacket - 1024 // room for the packet header and slack
	counts := make([]int64, 0, len(ops)+beginStatements)
	buf := append(s.buf[:0], beginCommit...)
	c.inTx = true
	first := true
	send := func() error {
		n, err := c.execCounts(string(buf))
		if err != nil {
			if first && c.stale(err) {
				return fmt.Errorf("%w: %w", errStale, err)
			}
			return err
		}
		first = false
		counts = append(counts, n...)
		buf = buf[:0]
		return nil
	}
	for _, i := range order {
		op := &ops[i]
		// An upper bound of the statement's length, so that a packet is
		// sent before it would grow past the server's limit.
		est := 512 + 3*litLen(len(op.Key)) + litLen(len(op.Value)) + litLen(len(op.Expected))
		if len(buf) > 0 && len(buf)+est > limit {
			if err := send(); err != nil {
				s.buf = buf
				c.rollback()
				return err
			}
		}
		if len(buf) > 0 {
			buf = append(buf, ';')
		}
		switch op.Kind {
		case sdk.OpPut:
			buf = s.sql.put(buf, op.Key, nonNil(op.Value))
		case sdk.OpDelete:
			buf = s.sql.del(buf, op.Key)
		case sdk.OpPutIfAbsent:
			buf = s.sql.putNew(buf, op.Key, nonNil(op.Value))
		case sdk.OpCompareAndSwap:
			buf = s.sql.cas(buf, op.Key, nonNil(op.Value), nonNil(op.Expected))
		case sdk.OpCompareAndDelete:
			buf = s.sql.cad(buf, op.Key, nonNil(op.Expected))
		default:
			s.buf = buf
			c.rollback()
			return fmt.Errorf("%w: op %d: unknown kind %d", sdk.ErrInvalid, i, op.Kind)
		}
	}
	err = send()
	s.buf = buf
	if err != nil {
		// COMMIT was never sent: nothing is applied. A deadlock already
		// rolled the transaction back; other errors leave it open.
		c.rollback()
		return err
	}
	if len(counts) != len(ops)+beginStatements {
		c.rollback()
		return fmt.Errorf("the server answered %d results to %d statements", len(counts), len(ops)+beginStatements)
	}
	failed := -1 // lowest index whose condition failed
	for k, i := range order {
		if ops[i].Kind != sdk.OpPut && ops[i].Kind != sdk.OpDelete && counts[beginStatements+k] != 1 && (failed < 0 || i < failed) {
			failed = i
		}
	}
	if failed >= 0 {
		return s.conflict(c, ops, failed)
	}
	if c.bad {
		// Checked here, not inferred from COMMIT's error: nothing has
		// been sent yet, so nothing was applied.
		return fmt.Errorf("%w: connection lost before COMMIT", sdk.ErrUnavailable)
	}
	err = c.exec("COMMIT")
	c.inTx = false
	if err != nil {
		return classifyCommit(err)
	}
	return nil
}

// conflict reads the current value of ops[index]'s key and rolls back, in
// one round trip. Under READ COMMITTED the read sees the newest committed
// version, the one the condition was checked against or a later one.
func (s *store) conflict(c *conn, ops []sdk.Op, index int) error {
	s.buf = s.sql.get(s.buf[:0], ops[index].Key)
	s.buf = append(s.buf, ";ROLLBACK"...)
	rows, err := c.query(string(s.buf))
	var cur []byte
	exists := false
	if err == nil {
		dest := make([]driver.Value, 1)
		switch err = rows.Next(dest); err {
		case nil:
			exists = true
			cur = nonNil(cloneValue(dest, 0))
		case io.EOF:
			err = nil
		}
		// Close reads ROLLBACK's answer.
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			c.inTx = false
		}
	}
	if err != nil {
		// The batch was not applied either way: the transaction never
		// committed.
		err = c.failed(err)
		c.rollback()
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

// classifyCommit maps an error of the COMMIT statement, once sent. Only a
// server answer that says the transaction was rolled back is certain: a
// transaction rollback (SQLSTATE class 40: deadlock; Commit retries it),
// an integrity violation (23), an invalid transaction state (25).
// Anything else (the connection lost, a timeout while waiting for the
// answer, the server shutting down in the middle) leaves the outcome
// unknown. The driver's "bad connection, safe to retry" verdict is not
// used: it is about the request's bytes, and COMMIT may have been applied
// although its answer never came (host/mysql_test.go, CommitCuts, cuts
// the connection right after COMMIT to check this).
func classifyCommit(err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch string(me.SQLState[:2]) {
		case "40", "23", "25":
			return err
		}
	}
	return fmt.Errorf("%w: COMMIT sent, outcome unknown: %v", sdk.ErrUncertain, err)
}
