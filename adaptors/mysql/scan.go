package main

import (
	"bytes"
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"slices"

	"github.com/engramkv/engram/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/sdk"
)

// beginSnapshot starts a long scan's transaction: REPEATABLE READ, so every
// page reads the snapshot taken at START (WITH CONSISTENT SNAPSHOT takes it
// there, not at the first read), and READ ONLY, which spares InnoDB a
// transaction id.
const beginSnapshot = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"

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

// Where the next page starts.
type posKind int

const (
	posStart posKind = iota // at the scan's start (or its end, in reverse)
	posAfter                // past pos.key, the last key returned
	posGroup                // at the first key, in scan order, of the keys whose head is pos.key
)

// iter is one scan. A scan that fits in its first page is a single SELECT
// (one statement is a snapshot by itself). A longer one holds a connection
// with a REPEATABLE READ READ ONLY transaction open until it ends, and
// reads keyset pages in it.
//
// Pages come in primary-key order, which is key order except inside a
// run of keys that share their first headLen bytes (ordered by the hash of
// their tails there). The iterator sorts each run it reads whole; a run
// that a page's LIMIT may have cut is left for the next page, which reads
// that head's keys alone, sorted by the server (a group query), and then
// the heads after it. Such runs need keys over 1 KiB with a common 1 KiB
// prefix: rare, but they must come out in order.
type iter struct {
	s          *store
	start, end []byte
	reverse    bool
	remaining  int // pairs the scan may still yield; -1: no limit

	conn    *conn // holds the snapshot transaction, once needed
	pos     posKind
	posKey  []byte
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
		complete, err = it.page(it.conn, "", n, n)
	}
	if err != nil {
		it.fail()
		return nil, fmt.Errorf("scan: %w", classify(err))
	}
	it.started = true
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
// the caller has seen nothing of the first attempt.
func (it *iter) first(ctx context.Context, n int) (bool, error) {
	for {
		c, reused, err := it.s.pool.Get(ctx)
		if err != nil {
			return false, err
		}
		complete, answered, err := it.firstOn(c, n)
		if err == nil {
			return complete, nil
		}
		stale := reused && !answered && it.s.drv.Stale(c, err)
		if it.conn == c {
			if !stale {
				return false, err // Next's fail ends the transaction
			}
			it.conn = nil
			it.s.pool.ReleaseScan()
		}
		it.s.pool.Put(c) // closes it: it failed
		if !stale {
			return false, err
		}
		// The connection had died while idle: a read is safe to run
		// again on a new one.
		it.arena, it.pairs = it.arena[:0], it.pairs[:0]
		it.pos, it.posKey = posStart, it.posKey[:0]
	}
}

// firstOn reads the first page on c. It returns c to the pool once done
// with it, unless the scan keeps it (it.conn) or the page failed. answered
// reports that c answered a statement: later failures are its own.
func (it *iter) firstOn(c *conn, n int) (complete, answered bool, err error) {
	bound := it.start
	if it.reverse {
		bound = it.end
	}
	// A bound that may share its head needs two statements (a group
	// query and a range), which only a transaction makes one snapshot.
	if !sqlkv.MayShareHead(bound) {
		last := it.remaining >= 0 && it.remaining <= n // this page ends the scan whatever follows
		probe := n + 1
		if last {
			probe = n
		}
		complete, err := it.page(c, "", probe, n)
		if err != nil {
			return false, false, err
		}
		if complete || (last && len(it.pairs) == n) {
			it.s.pool.Put(c)
			return true, true, nil
		}
		answered = true
	}
	if err := it.s.pool.HoldForScan(); err != nil {
		return false, answered, err
	}
	it.arena, it.pairs = it.arena[:0], it.pairs[:0]
	it.pos, it.posKey = posStart, it.posKey[:0]
	it.conn = c
	c.inTx = true
	complete, err = it.page(c, beginSnapshot, n, n)
	return complete, answered, err
}

// plan returns the statements of the next page: a group query for the
// head the page starts in, if keys may share it, and the range after it.
func (it *iter) plan(limit int) (group *pageQuery, rng pageQuery) {
	var edge bound // the bound the page starts from
	switch {
	case it.pos == posAfter:
		edge = bound{key: it.posKey}
	case it.reverse && len(it.end) > 0:
		edge = bound{key: it.end}
	case !it.reverse && len(it.start) > 0:
		edge = bound{key: it.start, inclusive: true}
	}
	var far bound // the scan's other bound
	switch {
	case it.reverse && len(it.start) > 0:
		far = bound{key: it.start, inclusive: true}
	case !it.reverse && len(it.end) > 0:
		far = bound{key: it.end}
	}
	lohi := func(q *pageQuery, e bound) {
		if it.reverse {
			q.lo, q.hi = far, e
		} else {
			q.lo, q.hi = e, far
		}
	}
	rng = pageQuery{reverse: it.reverse, limit: limit}
	switch {
	case it.pos == posGroup:
		group = &pageQuery{groupQuery: true, group: it.posKey, reverse: it.reverse, limit: limit}
		lohi(group, bound{})
		rng.group = it.posKey
		lohi(&rng, bound{})
	case edge.key != nil && sqlkv.MayShareHead(edge.key):
		group = &pageQuery{groupQuery: true, group: sqlkv.KeyHead(edge.key), reverse: it.reverse, limit: limit}
		lohi(group, edge)
		rng.group = sqlkv.KeyHead(edge.key)
		lohi(&rng, bound{})
	default:
		lohi(&rng, edge)
	}
	return group, rng
}

// page asks for up to limit rows from the page's position on c, running
// the statements in pre first in the same round trip, and keeps up to keep
// of them (a probe asks for one more than it keeps). It stops early once
// the batch holds pageBytes. It reports whether the scan is complete:
// nothing is left unread.
func (it *iter) page(c *conn, pre string, limit, keep int) (bool, error) {
	for {
		complete, again, err := it.pageOnce(c, pre, limit, keep)
		if err != nil || !again {
			return complete, err
		}
		pre = ""
		if it.conn == nil {
			// Outside the snapshot transaction a second statement would
			// read another snapshot: report the page incomplete, and
			// first reads it again inside one.
			return false, nil
		}
	}
}

// pageOnce reads one page; again is true when it yielded nothing because
// the page's rows were all one head's run that may continue (the next
// call reads that head alone).
func (it *iter) pageOnce(c *conn, pre string, limit, keep int) (complete, again bool, err error) {
	group, rng := it.plan(limit)
	buf := append(it.s.drv.buf[:0], pre...)
	if group != nil {
		if len(buf) > 0 {
			buf = append(buf, ';')
		}
		buf = it.s.drv.sql.page(buf, *group)
	}
	if len(buf) > 0 {
		buf = append(buf, ';')
	}
	buf = it.s.drv.sql.page(buf, rng)
	it.s.drv.buf = buf
	rows, err := c.query(string(buf))
	if err != nil {
		return false, false, err
	}
	defer rows.Close()
	dest := make([]driver.Value, 2)
	read := func() (count int, unread bool, err error) {
		for {
			if len(it.pairs) >= keep || (len(it.pairs) > 0 && len(it.arena) >= it.s.pageBytes) {
				// A probe's extra row, or the byte budget reached: stop;
				// Close drains what the server still sends.
				return count, true, nil
			}
			if err := rows.Next(dest); err == io.EOF {
				return count, false, nil
			} else if err != nil {
				return count, false, c.failed(err)
			}
			k, _ := dest[0].([]byte)
			v, _ := dest[1].([]byte)
			it.pairs = append(it.pairs, sdk.Pair{Key: sqlkv.AppendCopy(&it.arena, k), Value: sqlkv.AppendCopy(&it.arena, v)})
			count++
		}
	}
	if group != nil {
		count, unread, err := read()
		if err != nil {
			return false, false, err
		}
		if unread || count == limit {
			// The group may go on: the next page continues after its
			// last key (a group query again, since that key may share
			// its head).
			it.after()
			return false, false, c.closeRows(rows)
		}
		if err := rows.(driver.RowsNextResultSet).NextResultSet(); err != nil {
			return false, false, c.failed(err)
		}
	}
	from := len(it.pairs)
	count, unread, err := read()
	if err != nil {
		return false, false, err
	}
	if err := c.closeRows(rows); err != nil {
		return false, false, err
	}
	sortRuns(it.pairs[from:], it.reverse)
	more := unread || count == limit
	if more && len(it.pairs) > from && sqlkv.MayShareHead(it.pairs[len(it.pairs)-1].Key) {
		// The last run may continue past the LIMIT: leave it for the
		// next page, which starts with its head's group.
		h := sqlkv.KeyHead(it.pairs[len(it.pairs)-1].Key)
		j := len(it.pairs)
		for j > from && bytes.Equal(sqlkv.KeyHead(it.pairs[j-1].Key), h) {
			j--
		}
		it.pos, it.posKey = posGroup, append(it.posKey[:0], h...)
		it.pairs = it.pairs[:j]
		return false, len(it.pairs) == 0, nil
	}
	it.after()
	return !more, false, nil
}

// after moves the position past the last pair of the page, if any.
func (it *iter) after() {
	if len(it.pairs) > 0 {
		it.pos, it.posKey = posAfter, append(it.posKey[:0], it.pairs[len(it.pairs)-1].Key...)
	}
}

// closeRows closes rows, which reads what is left of the answer.
func (c *conn) closeRows(rows driver.Rows) error {
	if err := rows.Close(); err != nil {
		return c.failed(err)
	}
	return nil
}

// sortRuns sorts each run of pairs whose keys share a head into key order
// (descending for a reverse scan); the rest is in order already.
func sortRuns(ps []sdk.Pair, reverse bool) {
	for i := 0; i < len(ps); {
		j := i + 1
		if sqlkv.MayShareHead(ps[i].Key) {
			h := sqlkv.KeyHead(ps[i].Key)
			for j < len(ps) && bytes.Equal(sqlkv.KeyHead(ps[j].Key), h) {
				j++
			}
			if j-i > 1 {
				slices.SortFunc(ps[i:j], func(a, b sdk.Pair) int {
					if reverse {
						return bytes.Compare(b.Key, a.Key)
					}
					return bytes.Compare(a.Key, b.Key)
				})
			}
		}
		i = j
	}
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
	if !c.bad && c.inTx {
		if err := c.exec("COMMIT"); err == nil {
			c.inTx = false
		}
	}
	it.s.pool.Put(c)
}

// fail ends the scan after an error; the connection is closed unless it
// can be rolled back cleanly.
func (it *iter) fail() {
	it.done = true
	if it.conn == nil {
		return
	}
	c := it.conn
	it.conn = nil
	it.s.pool.ReleaseScan()
	c.rollback()
	it.s.pool.Put(c)
}

func (it *iter) Close() error {
	it.finish()
	return nil
}
