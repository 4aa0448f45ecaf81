package main

import (
	"bytes"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/wasm/sdk"
)

// Scan reads keyset pages in key order (ORDER BY key_head, internal_key,
// which the primary key serves); see sqlkv.Iterator.
func (s *store) Scan(_ context.Context, opts sdk.ScanOptions) (sdk.Iterator, error) {
	p := &pager{sql: s.drv.sql, start: bytes.Clone(opts.Start), end: bytes.Clone(opts.End), reverse: opts.Reverse}
	return sqlkv.NewIterator(s.pool, s.drv, p, opts.Limit, s.pageBytes), nil
}

// pager reads one scan's pages: each after the last key returned.
type pager struct {
	sql        *statements
	start, end []byte
	reverse    bool
	after      bool   // past last, not at the scan's start
	last       []byte // last key returned
}

func (p *pager) Probe() bool { return true }

func (p *pager) Rewind() { p.after = false }

// End commits the read-only transaction, or rolls back one an error
// aborted; the pool closes a connection left in any other state.
func (p *pager) End(c *conn, failed bool) {
	if c.IsClosed() {
		return
	}
	switch st := c.PgConn().TxStatus(); {
	case !failed && st != 'I':
		_, _ = simpleExec(c, `COMMIT`)
	case failed && st == 'E':
		_, _ = simpleExec(c, `ROLLBACK`)
	}
}

// Page asks for up to limit rows after p.last (or from the scan's start);
// see sqlkv.Pager. The scan is complete when fewer than limit rows came
// back, none left unread.
func (p *pager) Page(c *conn, b *sqlkv.Batch, tx sqlkv.Tx, limit, keep int) (bool, error) {
	lower := lowerNone
	upper := len(p.end) > 0
	var args []any
	if p.reverse {
		if len(p.start) > 0 {
			lower = lowerInclusive
			args = append(args, p.start)
		}
		if p.after {
			upper = true
			args = append(args, p.last)
		} else if upper {
			args = append(args, p.end)
		}
	} else {
		switch {
		case p.after:
			lower = lowerExclusive
			args = append(args, p.last)
		case len(p.start) > 0:
			lower = lowerInclusive
			args = append(args, p.start)
		}
		if upper {
			args = append(args, p.end)
		}
	}
	rev := 0
	if p.reverse {
		rev = 1
	}
	up := 0
	if upper {
		up = 1
	}
	args = append(args, limit)
	pb := &pgx.Batch{}
	if tx == sqlkv.BeginTx {
		pb.Queue(`BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY`)
	}
	pb.Queue(p.sql.pages[rev][lower][up], args...)
	br := c.SendBatch(context.Background(), pb)
	defer br.Close()
	if tx == sqlkv.BeginTx {
		if _, err := br.Exec(); err != nil {
			return false, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return false, err
	}
	defer rows.Close()
	if fd := rows.FieldDescriptions(); len(fd) != 2 || fd[0].Format != pgx.BinaryFormatCode || fd[1].Format != pgx.BinaryFormatCode {
		return false, fmt.Errorf("scan page: unexpected result columns %v (want internal_key, value in binary)", fd)
	}
	count, unread := 0, false
	for rows.Next() {
		count++
		if b.Full(keep) {
			// A probe's extra row, or the byte budget reached: stop;
			// Close drains what the server still sends.
			unread = true
			break
		}
		raw := rows.RawValues()
		b.Add(raw[0], raw[1])
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
	if n := len(b.Pairs); n > 0 {
		p.after, p.last = true, append(p.last[:0], b.Pairs[n-1].Key...)
	}
	return !unread && count < limit, nil
}
