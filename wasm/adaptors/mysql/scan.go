package main

import (
	"bytes"
	"context"
	"database/sql/driver"
	"io"
	"slices"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/wasm/sdk"
)

// beginSnapshot starts a long scan's transaction: REPEATABLE READ, so every
// page reads the snapshot taken at START (WITH CONSISTENT SNAPSHOT takes it
// there, not at the first read), and READ ONLY, which spares InnoDB a
// transaction id.
const beginSnapshot = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"

// Scan reads keyset pages in primary-key order; see sqlkv.Iterator and
// pager.
func (s *store) Scan(_ context.Context, opts sdk.ScanOptions) (sdk.Iterator, error) {
	p := &pager{drv: s.drv, start: bytes.Clone(opts.Start), end: bytes.Clone(opts.End), reverse: opts.Reverse}
	return sqlkv.NewIterator(s.pool, s.drv, p, opts.Limit, s.pageBytes), nil
}

// Where the next page starts.
type posKind int

const (
	posStart posKind = iota // at the scan's start (or its end, in reverse)
	posAfter                // past pos.key, the last key returned
	posGroup                // at the first key, in scan order, of the keys whose head is pos.key
)

// pager reads one scan's pages.
//
// Pages come in primary-key order, which is key order except inside a
// run of keys that share their first headLen bytes (ordered by the hash of
// their tails there). The pager sorts each run it reads whole; a run that
// a page's LIMIT may have cut is left for the next page, which reads that
// head's keys alone, sorted by the server (a group query), and then the
// heads after it. Such runs need keys over 1 KiB with a common 1 KiB
// prefix: rare, but they must come out in order.
type pager struct {
	drv        *adaptor
	start, end []byte
	reverse    bool
	pos        posKind
	posKey     []byte
}

// Probe: a bound that may share its head needs two statements (a group
// query and a range), which only a transaction makes one snapshot.
func (p *pager) Probe() bool {
	if p.reverse {
		return !sqlkv.MayShareHead(p.end)
	}
	return !sqlkv.MayShareHead(p.start)
}

func (p *pager) Rewind() { p.pos, p.posKey = posStart, p.posKey[:0] }

// End commits the read-only transaction, or rolls it back after an error;
// the pool closes a connection that fails either.
func (p *pager) End(c *conn, failed bool) {
	if failed {
		c.rollback()
		return
	}
	if !c.bad && c.inTx {
		if err := c.exec("COMMIT"); err == nil {
			c.inTx = false
		}
	}
}

// plan returns the statements of the next page: a group query for the
// head the page starts in, if keys may share it, and the range after it.
func (p *pager) plan(limit int) (group *pageQuery, rng pageQuery) {
	var edge bound // the bound the page starts from
	switch {
	case p.pos == posAfter:
		edge = bound{key: p.posKey}
	case p.reverse && len(p.end) > 0:
		edge = bound{key: p.end}
	case !p.reverse && len(p.start) > 0:
		edge = bound{key: p.start, inclusive: true}
	}
	var far bound // the scan's other bound
	switch {
	case p.reverse && len(p.start) > 0:
		far = bound{key: p.start, inclusive: true}
	case !p.reverse && len(p.end) > 0:
		far = bound{key: p.end}
	}
	lohi := func(q *pageQuery, e bound) {
		if p.reverse {
			q.lo, q.hi = far, e
		} else {
			q.lo, q.hi = e, far
		}
	}
	rng = pageQuery{reverse: p.reverse, limit: limit}
	switch {
	case p.pos == posGroup:
		group = &pageQuery{groupQuery: true, group: p.posKey, reverse: p.reverse, limit: limit}
		lohi(group, bound{})
		rng.group = p.posKey
		lohi(&rng, bound{})
	case edge.key != nil && sqlkv.MayShareHead(edge.key):
		group = &pageQuery{groupQuery: true, group: sqlkv.KeyHead(edge.key), reverse: p.reverse, limit: limit}
		lohi(group, edge)
		rng.group = sqlkv.KeyHead(edge.key)
		lohi(&rng, bound{})
	default:
		lohi(&rng, edge)
	}
	return group, rng
}

// Page reads from the page's position; see sqlkv.Pager.
func (p *pager) Page(c *conn, b *sqlkv.Batch, tx sqlkv.Tx, limit, keep int) (bool, error) {
	pre := ""
	if tx == sqlkv.BeginTx {
		pre = beginSnapshot
		c.inTx = true
	}
	for {
		complete, again, err := p.pageOnce(c, b, pre, limit, keep)
		if err != nil || !again {
			return complete, err
		}
		pre = ""
		if tx == sqlkv.NoTx {
			// Outside the snapshot transaction a second statement would
			// read another snapshot: report the page incomplete, and
			// sqlkv.Iterator reads it again inside one.
			return false, nil
		}
	}
}

// pageOnce reads one page; again is true when it yielded nothing because
// the page's rows were all one head's run that may continue (the next
// call reads that head alone).
func (p *pager) pageOnce(c *conn, b *sqlkv.Batch, pre string, limit, keep int) (complete, again bool, err error) {
	group, rng := p.plan(limit)
	buf := append(p.drv.buf[:0], pre...)
	if group != nil {
		if len(buf) > 0 {
			buf = append(buf, ';')
		}
		buf = p.drv.sql.page(buf, *group)
	}
	if len(buf) > 0 {
		buf = append(buf, ';')
	}
	buf = p.drv.sql.page(buf, rng)
	p.drv.buf = buf
	rows, err := c.query(string(buf))
	if err != nil {
		return false, false, err
	}
	defer rows.Close()
	dest := make([]driver.Value, 2)
	read := func() (count int, unread bool, err error) {
		for {
			if b.Full(keep) {
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
			b.Add(k, v)
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
			p.after(b)
			return false, false, c.closeRows(rows)
		}
		if err := rows.(driver.RowsNextResultSet).NextResultSet(); err != nil {
			return false, false, c.failed(err)
		}
	}
	from := len(b.Pairs)
	count, unread, err := read()
	if err != nil {
		return false, false, err
	}
	if err := c.closeRows(rows); err != nil {
		return false, false, err
	}
	sortRuns(b.Pairs[from:], p.reverse)
	more := unread || count == limit
	if more && len(b.Pairs) > from && sqlkv.MayShareHead(b.Pairs[len(b.Pairs)-1].Key) {
		// The last run may continue past the LIMIT: leave it for the
		// next page, which starts with its head's group.
		h := sqlkv.KeyHead(b.Pairs[len(b.Pairs)-1].Key)
		j := len(b.Pairs)
		for j > from && bytes.Equal(sqlkv.KeyHead(b.Pairs[j-1].Key), h) {
			j--
		}
		p.pos, p.posKey = posGroup, append(p.posKey[:0], h...)
		b.Truncate(j)
		return false, len(b.Pairs) == 0, nil
	}
	p.after(b)
	return !more, false, nil
}

// after moves the position past the last pair of the page, if any.
func (p *pager) after(b *sqlkv.Batch) {
	if len(b.Pairs) > 0 {
		p.pos, p.posKey = posAfter, append(p.posKey[:0], b.Pairs[len(b.Pairs)-1].Key...)
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
