package main

import (
	"bytes"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"

	"github.com/go-sql-driver/mysql"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/wasm/sdk"
)

// beginCommit starts a commit's transaction at READ COMMITTED (see
// sqlkv.Commit for why it is enough), which also spares the gap locks
// REPEATABLE READ takes for writes of absent keys: those deadlock batches
// that touch neighbouring keys. For INSERT IGNORE of an absent key, the
// lock that holds until the end of the transaction is the new record's.
const beginCommit = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED;START TRANSACTION"

// beginStatements is how many results beginCommit yields.
const beginStatements = 2

// Commit applies ops in one transaction; see sqlkv.Commit.
func (s *store) Commit(ctx context.Context, ops []sdk.Op) error {
	for i := range ops {
		if len(ops[i].Key) > maxKeyLen {
			return fmt.Errorf("%w: op %d: key of %d bytes (at most %d)", sdk.ErrInvalid, i, len(ops[i].Key), maxKeyLen)
		}
	}
	return sqlkv.Commit(ctx, s.pool, s.drv, ops)
}

// Write sends beginCommit and the batch's writes, in one round trip unless
// they exceed the server's max_allowed_packet. The ops go in key order;
// each run of consecutive ops of one kind is one statement (split only at
// the packet limit): a multi-row INSERT for puts and put-if-absents, an
// UPDATE or DELETE joined with a derived table of the run's keys for
// compare-and-swaps and compare-and-deletes; deletes stay a statement each.
// A group of Engram's creates, whose internal keyspaces keep each kind of
// write together, is three statements instead of hundreds (DESIGN.md:
// "Statements per round trip in the SQL adaptors"). Rows are locked in key
// order across the whole batch, as with a statement per op.
//
// A statement of a run of conditional ops counts the rows whose condition
// held, not which: when it falls short, some condition failed and the batch
// fails, so Write rolls back and runs the batch again a statement per op,
// whose counts name the op that failed first. Nothing was committed either
// time.
func (d *adaptor) Write(c *conn, ops []sdk.Op, order []int) ([]int64, error) {
	affected, short, err := d.write(c, ops, order, true)
	if err != nil || !short {
		return affected, err
	}
	c.rollback()
	if c.bad || c.inTx {
		return nil, fmt.Errorf("rolling back to find the failed condition: %w", sdk.ErrUnavailable)
	}
	affected, _, err = d.write(c, ops, order, false)
	return affected, err
}

// write sends the batch with its runs in multi-row statements (multi) or a
// statement per op. short reports a statement of a run of conditional ops
// whose condition held for fewer rows than it had: the affected counts of
// its ops are then unknown.
func (d *adaptor) write(c *conn, ops []sdk.Op, order []int, multi bool) (affected []int64, short bool, err error) {
	limit := d.maxPacket - 1024 // room for the packet header and slack
	counts := make([]int64, 0, len(ops)+beginStatements)
	buf := append(d.buf[:0], beginCommit...)
	defer func() { d.buf = buf }()
	c.inTx = true
	send := func() error {
		n, err := c.execCounts(string(buf))
		if err != nil {
			return err
		}
		counts = append(counts, n...)
		buf = buf[:0]
		return nil
	}
	// start begins a statement of about est bytes, sending what the
	// packet holds first if the statement would not fit.
	start := func(est int) error {
		if len(buf) > 0 && len(buf)+est > limit {
			if err := send(); err != nil {
				return err
			}
		}
		if len(buf) > 0 {
			buf = append(buf, ';')
		}
		return nil
	}
	// stmts are the runs of positions in order that the statements cover,
	// in the order sent.
	var stmts []sqlkv.Run
	for _, r := range sqlkv.Runs(ops, order) {
		if multi && r.Len() > 1 && !hasCompare(ops, order, r) {
			var head func([]byte) []byte
			var row func(buf []byte, first bool, op *sdk.Op) []byte
			tail := ""
			switch r.Kind {
			case sdk.OpPutIfAbsent, sdk.OpPut:
				verb := "INSERT IGNORE"
				if r.Kind == sdk.OpPut {
					verb, tail = "INSERT", upsert
				}
				head = func(buf []byte) []byte { return d.sql.insertHead(buf, verb) }
				row = func(buf []byte, first bool, op *sdk.Op) []byte {
					if !first {
						buf = append(buf, ',')
					}
					return d.sql.insertRow(buf, op.Key, sqlkv.NonNil(op.Value))
				}
			case sdk.OpCompareAndSwap:
				head, tail = d.sql.casManyHead, casManyTail
				row = func(buf []byte, first bool, op *sdk.Op) []byte {
					return d.sql.manyRow(buf, first, op.Key, sqlkv.NonNil(op.Value), sqlkv.NonNil(op.Expected))
				}
			case sdk.OpCompareAndDelete:
				head, tail = d.sql.cadManyHead, cadManyTail
				row = func(buf []byte, first bool, op *sdk.Op) []byte {
					return d.sql.manyRow(buf, first, op.Key, nil, sqlkv.NonNil(op.Expected))
				}
			}
			if head != nil {
				cur := sqlkv.Run{Kind: r.Kind, From: r.From, To: r.From} // the current statement's
				for k := r.From; k < r.To; k++ {
					op := &ops[order[k]]
					est := 64 + 3*litLen(len(op.Key)) + litLen(len(op.Value)) + litLen(len(op.Expected)) + len(tail)
					if cur.Len() > 0 && len(buf)+est > limit {
						// The statement is full: end it and send the packet.
						buf = append(buf, tail...)
						stmts = append(stmts, cur)
						if err := send(); err != nil {
							return nil, false, err
						}
						cur.From = k
					}
					if cur.Len() == 0 {
						if err := start(est + 256); err != nil {
							return nil, false, err
						}
						buf = head(buf)
					}
					buf = row(buf, cur.Len() == 0, op)
					cur.To = k + 1
				}
				buf = append(buf, tail...)
				stmts = append(stmts, cur)
				continue
			}
		}
		for k := r.From; k < r.To; k++ {
			op := &ops[order[k]]
			if isCompare(op) {
				if err := start(512 + 4*litLen(len(op.Key)) + 2*litLen(len(op.Value))); err != nil {
					return nil, false, err
				}
				buf = d.sql.compare(buf, op.Key, sqlkv.NonNil(op.Value))
				stmts = append(stmts, sqlkv.Run{Kind: op.Kind, From: k, To: k + 1})
				// The other statements' counts are no op's: runs of
				// no position.
				for range compareStatements - 1 {
					stmts = append(stmts, sqlkv.Run{Kind: sdk.OpPut, From: k, To: k})
				}
				continue
			}
			// An upper bound of the statement's length.
			if err := start(512 + 3*litLen(len(op.Key)) + litLen(len(op.Value)) + litLen(len(op.Expected))); err != nil {
				return nil, false, err
			}
			switch op.Kind {
			case sdk.OpPut:
				buf = d.sql.put(buf, op.Key, sqlkv.NonNil(op.Value))
			case sdk.OpDelete:
				buf = d.sql.del(buf, op.Key)
			case sdk.OpPutIfAbsent:
				buf = d.sql.putNew(buf, op.Key, sqlkv.NonNil(op.Value))
			case sdk.OpCompareAndSwap:
				buf = d.sql.cas(buf, op.Key, sqlkv.NonNil(op.Value), sqlkv.NonNil(op.Expected))
			case sdk.OpCompareAndDelete:
				buf = d.sql.cad(buf, op.Key, sqlkv.NonNil(op.Expected))
			}
			stmts = append(stmts, sqlkv.Run{Kind: op.Kind, From: k, To: k + 1})
		}
	}
	if len(buf) > 0 {
		if err := send(); err != nil {
			return nil, false, err
		}
	}
	if len(counts) != len(stmts)+beginStatements {
		return nil, false, fmt.Errorf("the server answered %d results to %d statements", len(counts), len(stmts)+beginStatements)
	}
	counts = counts[beginStatements:]
	affected = make([]int64, len(order))
	for s, r := range stmts {
		switch {
		case r.Len() == 0:
			// A statement of a compare that is not its condition.
		case r.Len() == 1:
			affected[r.From] = counts[s]
		case r.Kind != sdk.OpPut && r.Kind != sdk.OpDelete && counts[s] != int64(r.Len()):
			short = true
		default:
			// Every row's condition held, or unconditional (an upsert
			// counts 1 or 2 per row).
			for k := r.From; k < r.To; k++ {
				affected[k] = 1
			}
		}
	}
	return affected, short, nil
}

// Conflict reads key and rolls back, in one round trip.
func (d *adaptor) Conflict(c *conn, key []byte) ([]byte, bool, error) {
	d.buf = d.sql.get(d.buf[:0], key)
	d.buf = append(d.buf, ";ROLLBACK"...)
	rows, err := c.query(string(d.buf))
	if err != nil {
		return nil, false, err
	}
	var cur []byte
	exists := false
	dest := make([]driver.Value, 1)
	switch err = rows.Next(dest); err {
	case nil:
		exists = true
		cur = sqlkv.NonNil(cloneValue(dest, 0))
	case io.EOF:
		err = nil
	}
	// Close reads ROLLBACK's answer.
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, false, c.failed(err)
	}
	c.inTx = false
	return cur, exists, nil
}

// Rollback ends a transaction that failed before COMMIT: a deadlock
// already rolled it back, other errors leave it open.
func (d *adaptor) Rollback(c *conn) { c.rollback() }

func (d *adaptor) InTransaction(c *conn) bool { return !c.bad && c.inTx }

func (d *adaptor) Commit(c *conn) error {
	err := c.exec("COMMIT")
	c.inTx = false
	return err
}

// CommitAborted: a transaction rollback (SQLSTATE class 40: deadlock;
// Commit retries it), an integrity violation (23), an invalid transaction
// state (25). The driver's "bad connection, safe to retry" verdict is about
// the request's bytes, not whether COMMIT was applied: it is not used.
func (d *adaptor) CommitAborted(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch string(me.SQLState[:2]) {
		case "40", "23", "25":
			return true
		}
	}
	return false
}

// isCompare reports whether op is a compare-and-swap to the value it
// expects, which statements.compare writes.
func isCompare(op *sdk.Op) bool {
	return op.Kind == sdk.OpCompareAndSwap && bytes.Equal(op.Value, op.Expected)
}

// hasCompare reports whether run r of ops (positions in order) holds a
// compare, which a multi-row statement cannot write.
func hasCompare(ops []sdk.Op, order []int, r sqlkv.Run) bool {
	if r.Kind != sdk.OpCompareAndSwap {
		return false
	}
	for k := r.From; k < r.To; k++ {
		if isCompare(&ops[order[k]]) {
			return true
		}
	}
	return false
}
