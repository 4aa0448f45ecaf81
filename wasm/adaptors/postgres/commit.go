package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/wasm/sdk"
)

// errRolledBack is a COMMIT the server answered with ROLLBACK.
var errRolledBack = errors.New("COMMIT answered ROLLBACK: the transaction was rolled back")

// Commit applies ops in one transaction; see sqlkv.Commit.
func (s *store) Commit(ctx context.Context, ops []sdk.Op) error {
	return sqlkv.Commit(ctx, s.pool, s.drv, ops)
}

// Write sends BEGIN and the batch's writes in one pipelined round trip: the
// ops in key order, each run of consecutive ops of one kind as one
// statement that takes their keys (and values, expected values) as arrays,
// or as the single-row statement for a run of one op. Engram's internal
// keyspaces keep each kind of its batches' writes together (revision keys,
// history, the change log), so a group of creates is three statements
// instead of hundreds (DESIGN.md: "Statements per round trip in the SQL
// adaptors"). The conditional statements return the keys whose condition
// held, so the op that failed is still known exactly. Rows are locked in
// key order across the whole batch, as with a statement per op: unnest
// yields the arrays in order and each statement reaches its rows in it.
func (d *adaptor) Write(c *conn, ops []sdk.Op, order []int) ([]int64, error) {
	runs := sqlkv.Runs(ops, order)
	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`)
	for _, r := range runs {
		if r.Len() == 1 {
			d.queueOne(b, &ops[order[r.From]])
		} else {
			d.queueMany(b, r.Kind, ops, order[r.From:r.To])
		}
	}
	br := c.SendBatch(context.Background(), b)
	affected := make([]int64, len(order))
	_, err := br.Exec()
	for _, r := range runs {
		if err != nil {
			break
		}
		if r.Len() == 1 || r.Kind == sdk.OpPut || r.Kind == sdk.OpDelete {
			var tag pgconn.CommandTag
			if tag, err = br.Exec(); err == nil && r.Len() == 1 {
				affected[r.From] = tag.RowsAffected()
			}
			continue
		}
		// The keys whose condition held; the others' ops failed.
		held := make(map[string]struct{}, r.Len())
		var rows pgx.Rows
		if rows, err = br.Query(); err != nil {
			break
		}
		for rows.Next() {
			held[string(rows.RawValues()[0])] = struct{}{}
		}
		rows.Close()
		if err = rows.Err(); err != nil {
			break
		}
		for k := r.From; k < r.To; k++ {
			if _, ok := held[string(ops[order[k]].Key)]; ok {
				affected[k] = 1
			}
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return affected, nil
}

// queueOne queues op's single-row statement.
func (d *adaptor) queueOne(b *pgx.Batch, op *sdk.Op) {
	switch op.Kind {
	case sdk.OpPut:
		b.Queue(d.sql.put, op.Key, sqlkv.NonNil(op.Value))
	case sdk.OpDelete:
		b.Queue(d.sql.del, op.Key)
	case sdk.OpPutIfAbsent:
		b.Queue(d.sql.putNew, op.Key, sqlkv.NonNil(op.Value))
	case sdk.OpCompareAndSwap:
		b.Queue(d.sql.cas, op.Key, sqlkv.NonNil(op.Value), sqlkv.NonNil(op.Expected))
	case sdk.OpCompareAndDelete:
		b.Queue(d.sql.cad, op.Key, sqlkv.NonNil(op.Expected))
	}
}

// queueMany queues the multi-row statement of the ops at idx, all of
// kind.
func (d *adaptor) queueMany(b *pgx.Batch, kind sdk.OpKind, ops []sdk.Op, idx []int) {
	keys := make([][]byte, len(idx))
	var values, expected [][]byte
	switch kind {
	case sdk.OpPut, sdk.OpPutIfAbsent, sdk.OpCompareAndSwap:
		values = make([][]byte, len(idx))
	}
	switch kind {
	case sdk.OpCompareAndSwap, sdk.OpCompareAndDelete:
		expected = make([][]byte, len(idx))
	}
	for n, i := range idx {
		op := &ops[i]
		keys[n] = op.Key
		if values != nil {
			values[n] = sqlkv.NonNil(op.Value)
		}
		if expected != nil {
			expected[n] = sqlkv.NonNil(op.Expected)
		}
	}
	switch kind {
	case sdk.OpPut:
		b.Queue(d.sql.putMany, keys, values)
	case sdk.OpDelete:
		b.Queue(d.sql.delMany, keys)
	case sdk.OpPutIfAbsent:
		b.Queue(d.sql.putNewMany, keys, values)
	case sdk.OpCompareAndSwap:
		b.Queue(d.sql.casMany, keys, values, expected)
	case sdk.OpCompareAndDelete:
		b.Queue(d.sql.cadMany, keys, expected)
	}
}

// Conflict reads key and rolls back, in one round trip.
func (d *adaptor) Conflict(c *conn, key []byte) ([]byte, bool, error) {
	b := &pgx.Batch{}
	b.Queue(d.sql.get, key)
	b.Queue(`ROLLBACK`)
	br := c.SendBatch(context.Background(), b)
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
	return cur, exists, err
}

func (d *adaptor) Rollback(c *conn) {
	if c.IsClosed() || c.PgConn().TxStatus() == 'I' {
		return
	}
	_, _ = simpleExec(c, `ROLLBACK`)
}

func (d *adaptor) InTransaction(c *conn) bool {
	return !c.IsClosed() && c.PgConn().TxStatus() == 'T'
}

func (d *adaptor) Commit(c *conn) error {
	tag, err := simpleExec(c, `COMMIT`)
	if err != nil {
		return err
	}
	if tag.String() != "COMMIT" {
		// The server answers ROLLBACK to a COMMIT of an aborted
		// transaction; it cannot be aborted here, but never report it as
		// applied.
		return fmt.Errorf("%w (%q)", errRolledBack, tag.String())
	}
	return nil
}

// CommitAborted: a transaction rollback (40xxx: serialization failure,
// deadlock; Commit retries those), a deferred constraint violation
// (23xxx), an invalid transaction state (25xxx). pgx reports a connection
// it found closed while reading COMMIT's answer as safe to retry, although
// COMMIT was sent and applied: that verdict is not used.
func (d *adaptor) CommitAborted(err error) bool {
	if errors.Is(err, errRolledBack) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && len(pe.Code) == 5 {
		switch pe.Code[:2] {
		case "40", "23", "25":
			return true
		}
	}
	return false
}
