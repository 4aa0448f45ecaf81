package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"

	"github.com/go-sql-driver/mysql"

	"github.com/engramkv/engram/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/sdk"
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

// Write sends beginCommit and every op's statement, in one round trip
// unless they exceed the server's max_allowed_packet; each statement's
// affected-row count says whether its condition held.
func (d *adaptor) Write(c *conn, ops []sdk.Op, order []int) ([]int64, error) {
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
	for _, i := range order {
		op := &ops[i]
		// An upper bound of the statement's length, so that a packet is
		// sent before it would grow past the server's limit.
		est := 512 + 3*litLen(len(op.Key)) + litLen(len(op.Value)) + litLen(len(op.Expected))
		if len(buf) > 0 && len(buf)+est > limit {
			if err := send(); err != nil {
				return nil, err
			}
		}
		if len(buf) > 0 {
			buf = append(buf, ';')
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
	}
	if err := send(); err != nil {
		return nil, err
	}
	if len(counts) != len(ops)+beginStatements {
		return nil, fmt.Errorf("the server answered %d results to %d statements", len(counts), len(ops)+beginStatements)
	}
	return counts[beginStatements:], nil
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
