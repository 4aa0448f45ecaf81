package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/engramkv/engram/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/sdk"
)

// errRolledBack is a COMMIT the server answered with ROLLBACK.
var errRolledBack = errors.New("COMMIT answered ROLLBACK: the transaction was rolled back")

// Commit applies ops in one transaction; see sqlkv.Commit.
func (s *store) Commit(ctx context.Context, ops []sdk.Op) error {
	return sqlkv.Commit(ctx, s.pool, s.drv, ops)
}

// Write sends BEGIN and every op's statement in one pipelined round trip.
func (d *adaptor) Write(c *conn, ops []sdk.Op, order []int) ([]int64, error) {
	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`)
	for _, i := range order {
		op := &ops[i]
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
	br := c.SendBatch(context.Background(), b)
	affected := make([]int64, 0, len(order))
	_, err := br.Exec()
	for range order {
		if err != nil {
			break
		}
		var tag pgconn.CommandTag
		if tag, err = br.Exec(); err == nil {
			affected = append(affected, tag.RowsAffected())
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return affected, err
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
