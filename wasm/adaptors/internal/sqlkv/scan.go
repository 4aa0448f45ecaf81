package sqlkv

import (
	"context"
	"fmt"

	"github.com/engramkv/engram/wasm/sdk"
)

// Tx says how a scan page stands to the scan's snapshot transaction.
type Tx int

const (
	// NoTx: a single statement, outside any transaction (one statement is
	// a snapshot by itself).
	NoTx Tx = iota
	// BeginTx: start the snapshot transaction in the page's round trip.
	BeginTx
	// InTx: inside the snapshot transaction.
	InTx
)

// Pager is an adaptor's side of a scan: its SQL, and where the next page
// starts, which depends on how its table orders keys.
type Pager[C Conn] interface {
	// Page reads up to limit rows from the scan's position on c into b,
	// adding at most keep of them (a probe asks for one more than it
	// keeps) and stopping once b is full, and moves the position past
	// what it added. It reports whether the scan is complete: nothing is
	// left unread.
	Page(c C, b *Batch, tx Tx, limit, keep int) (complete bool, err error)
	// Rewind moves the position back to the scan's start.
	Rewind()
	// Probe reports whether the first page can be read with NoTx; if not,
	// every scan takes a transaction.
	Probe() bool
	// End ends the snapshot transaction on c if it is open: COMMIT after
	// success (it releases the snapshot), ROLLBACK after an error. The
	// pool closes c if that leaves it unusable.
	End(c C, failed bool)
}

// Batch is what one Next returns, in one arena reused across calls.
type Batch struct {
	Pairs []sdk.Pair
	arena []byte
	// budget bounds the bytes of a batch, so a page of 4 MiB values
	// cannot exhaust the instance's memory.
	budget int
}

// Add appends a copy of the pair k, v.
func (b *Batch) Add(k, v []byte) {
	b.Pairs = append(b.Pairs, sdk.Pair{Key: AppendCopy(&b.arena, k), Value: AppendCopy(&b.arena, v)})
}

// Full reports whether the batch holds keep pairs or its byte budget.
func (b *Batch) Full(keep int) bool {
	return len(b.Pairs) >= keep || (len(b.Pairs) > 0 && len(b.arena) >= b.budget)
}

// Truncate drops the pairs from the n-th on.
func (b *Batch) Truncate(n int) { b.Pairs = b.Pairs[:n] }

func (b *Batch) reset() { b.Pairs, b.arena = b.Pairs[:0], b.arena[:0] }

// ScanDriver is what a scan needs of an adaptor's Driver.
type ScanDriver[C Conn] interface {
	Stale(c C, err error) bool
	Classify(err error) error
}

// Iterator is one scan. A scan that fits in its first page is a single
// statement and holds no connection between calls. A longer one holds a
// connection with a snapshot transaction (REPEATABLE READ, READ ONLY)
// open until it ends, and reads keyset pages in it.
//
// It reads nothing until the first Next: the SDK asks for the first batch
// within the same SCAN_OPEN call (ABI.md: SCAN_OPEN returns the first
// batch), so the snapshot taken by the first page is taken before the
// host's Scan returns, as the contract requires.
type Iterator[C Conn] struct {
	pool      *Pool[C]
	drv       ScanDriver[C]
	pager     Pager[C]
	remaining int // pairs the scan may still yield; -1: no limit

	conn    C    // holds the snapshot transaction, once needed
	held    bool // conn is set
	started bool
	done    bool
	batch   Batch
}

// NewIterator returns a scan of at most limit pairs (0: no limit) whose
// batches hold up to budget bytes (past their first pair).
func NewIterator[C Conn](p *Pool[C], d ScanDriver[C], pager Pager[C], limit, budget int) *Iterator[C] {
	it := &Iterator[C]{pool: p, drv: d, pager: pager, remaining: -1, batch: Batch{budget: budget}}
	if limit > 0 {
		it.remaining = limit
	}
	return it
}

func (it *Iterator[C]) Next(ctx context.Context, max int) ([]sdk.Pair, error) {
	if it.done {
		return nil, nil
	}
	n := max
	if it.remaining >= 0 {
		n = min(n, it.remaining)
	}
	if n <= 0 {
		it.finish(false)
		return nil, nil
	}
	it.batch.reset()
	var complete bool
	var err error
	if !it.started {
		complete, err = it.first(ctx, n)
	} else {
		complete, err = it.pager.Page(it.conn, &it.batch, InTx, n, n)
	}
	if err != nil {
		it.finish(true)
		return nil, fmt.Errorf("scan: %w", it.drv.Classify(err))
	}
	it.started = true
	if it.remaining >= 0 {
		it.remaining -= len(it.batch.Pairs)
	}
	if complete || it.remaining == 0 {
		it.finish(false)
	}
	return it.batch.Pairs, nil
}

// first reads the first page. It tries a single statement first, asking
// for one row more than the page: if that row is not there, the scan is
// complete and needed no transaction. Otherwise the page is read again
// inside the snapshot transaction that the rest of the scan continues in;
// the caller has seen nothing of the first attempt. A pooled connection
// that had died while idle fails the call's first statement, which then
// runs again on a new connection: a read, safe to repeat.
func (it *Iterator[C]) first(ctx context.Context, n int) (bool, error) {
	for {
		c, reused, err := it.pool.Get(ctx)
		if err != nil {
			return false, err
		}
		complete, answered, err := it.firstOn(c, n)
		if err == nil {
			return complete, nil
		}
		stale := reused && !answered && it.drv.Stale(c, err)
		if it.held {
			if !stale {
				return false, err // Next's finish ends the transaction
			}
			var zero C
			it.conn, it.held = zero, false
			it.pool.ReleaseScan()
		}
		it.pool.Put(c) // closes it: it failed
		if !stale {
			return false, err
		}
		it.batch.reset()
		it.pager.Rewind()
	}
}

// firstOn reads the first page on c. It returns c to the pool once done
// with it, unless the scan holds it or the page failed before the scan
// took it. answered reports that c answered a statement: later failures
// are its own.
func (it *Iterator[C]) firstOn(c C, n int) (complete, answered bool, err error) {
	if it.pager.Probe() {
		last := it.remaining >= 0 && it.remaining <= n // this page ends the scan whatever follows
		probe := n + 1
		if last {
			probe = n
		}
		complete, err := it.pager.Page(c, &it.batch, NoTx, probe, n)
		if err != nil {
			return false, false, err
		}
		if complete || (last && len(it.batch.Pairs) == n) {
			it.pool.Put(c)
			return true, true, nil
		}
		answered = true
	}
	if err := it.pool.HoldForScan(); err != nil {
		return false, answered, err
	}
	it.batch.reset()
	it.pager.Rewind()
	it.conn, it.held = c, true
	complete, err = it.pager.Page(c, &it.batch, BeginTx, n, n)
	return complete, answered, err
}

// finish ends the scan: it ends the snapshot transaction, if any, and
// returns the connection.
func (it *Iterator[C]) finish(failed bool) {
	it.done = true
	if !it.held {
		return
	}
	c := it.conn
	var zero C
	it.conn, it.held = zero, false
	it.pool.ReleaseScan()
	it.pager.End(c, failed)
	it.pool.Put(c)
}

func (it *Iterator[C]) Close() error {
	it.finish(false)
	return nil
}
