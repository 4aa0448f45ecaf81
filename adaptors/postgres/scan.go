package main

import (
	"bytes"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/engramkv/engram/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/sdk"
)

// Scan returns an iterator that reads nothing yet: the SDK asks for the
// first batch within the same SCAN_OPEN call (ABI.md: SCAN_OPEN returns the
// first batch), so the snapshot taken by the first page is taken before the
// host's Scan returns, as the contract requires.
func (s *store) Scan(_ context.Context, opts sdk.ScanOptions) (sdk.Iterator, error) {
	it := &iter{s: s, start: bytes.Clone(opts.Start), end: bytes.Clone(opts.End), reverse: opts.Reverse, remaining: -1}
	if opts.Limit > 0 {
		it.remaining = opts.Limit
	}
	return it, nil
}

// iter is one scan. A scan that fits in its first page is a single SELECT
// (one statement is a snapshot by itself). A longer one holds a connection
// with a REPEATABLE READ READ ONLY transaction open until it ends, and
// reads keyset pages in it: after the last key returned, in key order.
type iter struct {
	s          *store
	start, end []byte
	reverse    bool
	remaining  int // pairs the scan may still yield; -1: no limit

	conn    *conn  // holds the snapshot transaction, once needed
	last    []byte // last key returned
	started bool
	done    bool

	arena []byte // the current batch's bytes, reused across batches
	pairs []sdk.Pair
}

func (it *iter) Next(ctx context.Context, max int) ([]sdk.Pair, error) {
	if it.done {
		return nil, nil
	}
	n := max
	if it.remaining >= 0 {
		n = min(n, it.remaining)
	}
	if n <= 0 {
		it.finish()
		return nil, nil
	}
	it.arena, it.pairs = it.arena[:0], it.pairs[:0]
	var complete bool
	var err error
	if !it.started {
		complete, err = it.first(ctx, n)
	} else {
		complete, err = it.page(it.conn, nil, n, n)
	}
	if err != nil {
		it.fail()
		return nil, fmt.Errorf("scan: %w", classify(err))
	}
	it.started = true
	if len(it.pairs) > 0 {
		it.last = append(it.last[:0], it.pairs[len(it.pairs)-1].Key...)
	}
	if it.remaining >= 0 {
		it.remaining -= len(it.pairs)
	}
	if complete || it.remaining == 0 {
		it.finish()
	}
	return it.pairs, nil
}

// first reads the first page. It tries a single statement first, asking
// for one row more than the page: if that row is not there, the scan is
// complete and needed no transaction. Otherwise the page is read again
// inside the snapshot transaction that the rest of the scan continues in;
// the caller has seen nothing of the first attempt. A pooled connection
// that had died while idle fails the single statement, which is then run
// again on a new one.
func (it *iter) first(ctx context.Context, n int) (bool, error) {
	last := it.remaining >= 0 && it.remaining <= n // this page ends the scan whatever follows
	probe := n + 1
	if last {
		probe = n
	}
	for {
		c, reused, err := it.s.pool.Get(ctx)
		if err != nil {
			return false, err
		}
		complete, err := it.page(c, nil, probe, n)
		if err != nil {
			it.s.pool.Put(c)
			if reused && it.s.drv.Stale(c, err) {
				it.arena, it.pairs = it.arena[:0], it.pairs[:0]
				continue
			}
			return false, err
		}
		if complete || (last && len(it.pairs) == n) {
			it.s.pool.Put(c)
			return true, nil
		}
		if err := it.s.pool.HoldForScan(); err != nil {
			it.s.pool.Put(c)
			return false, err
		}
		it.arena, it.pairs = it.arena[:0], it.pairs[:0]
		it.conn = c
		return it.page(c, []string{`BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY`}, n, n)
	}
}

// page asks for up to limit rows after it.last (or from the scan's start)
// on c, running the statements in pre first in the same round trip, and
// keeps up to keep of them (a probe asks for one more than it keeps). It
// stops early once the batch holds pageBytes. It reports whether the scan
// is complete: fewer than limit rows came back, none left unread.
func (it *iter) page(c *conn, pre []string, limit, keep int) (bool, error) {
	lower := lowerNone
	upper := len(it.end) > 0
	var args []any
	if it.reverse {
		if len(it.start) > 0 {
			lower = lowerInclusive
			args = append(args, it.start)
		}
		if it.started {
			upper = true
			args = append(args, it.last)
		} else if upper {
			args = append(args, it.end)
		}
	} else {
		switch {
		case it.started:
			lower = lowerExclusive
			args = append(args, it.last)
		case len(it.start) > 0:
			lower = lowerInclusive
			args = append(args, it.start)
		}
		if upper {
			args = append(args, it.end)
		}
	}
	rev := 0
	if it.reverse {
		rev = 1
	}
	up := 0
	if upper {
		up = 1
	}
	args = append(args, limit)
	sql := it.s.drv.sql.pages[rev][lower][up]

	b := &pgx.Batch{}
	for _, p := range pre {
		b.Queue(p)
	}
	b.Queue(sql, args...)
	br := c.SendBatch(context.Background(), b)
	defer br.Close()
	for range pre {
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
		if len(it.pairs) >= keep || (len(it.pairs) > 0 && len(it.arena) >= it.s.pageBytes) {
			// A probe's extra row, or the byte budget reached: stop;
			// Close drains what the server still sends.
			unread = true
			break
		}
		raw := rows.RawValues()
		it.pairs = append(it.pairs, sdk.Pair{Key: sqlkv.AppendCopy(&it.arena, raw[0]), Value: sqlkv.AppendCopy(&it.arena, raw[1])})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
	return !unread && count < limit, nil
}

// finish ends the scan: commits the read-only transaction (which releases
// its snapshot) and returns the connection.
func (it *iter) finish() {
	it.done = true
	if it.conn == nil {
		return
	}
	c := it.conn
	it.conn = nil
	it.s.pool.ReleaseScan()
	if !c.IsClosed() && c.PgConn().TxStatus() != 'I' {
		_, _ = simpleExec(c, `COMMIT`)
	}
	it.s.pool.Put(c)
}

// fail ends the scan after an error; the connection is closed unless it is
// cleanly out of its transaction.
func (it *iter) fail() {
	it.done = true
	if it.conn == nil {
		return
	}
	c := it.conn
	it.conn = nil
	it.s.pool.ReleaseScan()
	if !c.IsClosed() && c.PgConn().TxStatus() == 'E' {
		_, _ = simpleExec(c, `ROLLBACK`)
	}
	it.s.pool.Put(c)
}

func (it *iter) Close() error {
	it.finish()
	return nil
}
