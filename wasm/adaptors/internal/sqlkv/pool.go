package sqlkv

import (
	"context"
	"errors"
	"fmt"

	"github.com/engramkv/engram/wasm/sdk"
)

// Conn is a driver's server connection as the pool sees it.
type Conn interface {
	// Reusable reports whether the connection may serve another call:
	// open, and outside any transaction (reusing one that an error left
	// inside a transaction would run the next statement in it).
	Reusable() bool
	// Close ends the connection; the server rolls back what it held.
	Close()
}

// Pool holds one instance's connections. The instance serves one call at
// a time, so there is no locking; a connection is either idle, serving
// the current call, or held by an open scan.
type Pool[C Conn] struct {
	connect func(context.Context) (C, error)
	max     int
	idle    []C
	open    int
	scans   int // connections held by open scans
}

// NewPool returns a pool of up to max connections that connect opens.
func NewPool[C Conn](max int, connect func(context.Context) (C, error)) *Pool[C] {
	return &Pool[C]{connect: connect, max: max}
}

// Get returns an idle connection or opens one; reused says it was idle in
// the pool, where the server (an idle timeout, a restart, a KILL) or a
// proxy may have closed it meanwhile, which shows only when it is used.
// Get fails when every connection is held by an open scan: nothing would
// release one while the instance waits.
func (p *Pool[C]) Get(ctx context.Context) (c C, reused bool, err error) {
	if n := len(p.idle); n > 0 {
		c = p.idle[n-1]
		p.idle = p.idle[:n-1]
		return c, true, nil
	}
	if p.open >= p.max {
		return c, false, fmt.Errorf("%w: all %d connections of this instance are held by open scans (raise pool-size)", sdk.ErrUnavailable, p.max)
	}
	c, err = p.connect(ctx)
	if err != nil {
		return c, false, err
	}
	p.open++
	return c, false, nil
}

// Put returns a connection the caller got from Get; one that is not
// reusable is closed instead.
func (p *Pool[C]) Put(c C) {
	if !c.Reusable() {
		p.Discard(c)
		return
	}
	p.idle = append(p.idle, c)
}

// Discard closes a connection the caller got from Get.
func (p *Pool[C]) Discard(c C) {
	p.open--
	c.Close()
}

// CloseAll closes the idle connections; the pool is not used again. A nil
// pool (an instance whose Init failed early) holds none.
func (p *Pool[C]) CloseAll() {
	if p == nil {
		return
	}
	for _, c := range p.idle {
		c.Close()
	}
	p.idle = nil
	p.open = 0
}

// HoldForScan counts a connection the caller got as held by a scan until
// ReleaseScan. Scans may hold all connections but one, which stays for
// Get and Commit: a burst of long scans must fail those scans, not
// Engram's writes.
func (p *Pool[C]) HoldForScan() error {
	if p.scans >= p.max-1 {
		return fmt.Errorf("%w: %d open scans hold all connections of this instance that scans may use (raise pool-size, now %d)", sdk.ErrUnavailable, p.scans, p.max)
	}
	p.scans++
	return nil
}

// ReleaseScan ends a HoldForScan.
func (p *Pool[C]) ReleaseScan() { p.scans-- }

// Run runs call on a pooled connection, and again on a new one when the
// pooled one turns out to have died while idle (stale, asked only of a
// connection that was idle, about call's error). call must send nothing
// that could apply a change before its first answer: a read, or the
// statements of a transaction before its COMMIT. Run returns the
// connection to the pool after each attempt.
func (p *Pool[C]) Run(ctx context.Context, stale func(C, error) bool, call func(C) error) error {
	for {
		c, reused, err := p.Get(ctx)
		if err != nil {
			return err
		}
		err = call(c)
		p.Put(c)
		// A new connection is never stale: the loop ends.
		if err == nil || !reused || !stale(c, err) {
			return err
		}
	}
}

// Do runs call as Run does, for a call whose failure changed nothing (a
// read, a statement outside a transaction): its error is classified
// (Driver.Classify) and prefixed with what, except sdk.ErrNotFound, which
// is passed on as it is.
func Do[C Conn](ctx context.Context, p *Pool[C], d Driver[C], what string, call func(C) error) error {
	err := p.Run(ctx, d.Stale, call)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sdk.ErrNotFound):
		return sdk.ErrNotFound
	}
	return fmt.Errorf("%s: %w", what, d.Classify(err))
}

// Query is Do for a call that reads a value.
func Query[C Conn, T any](ctx context.Context, p *Pool[C], d Driver[C], what string, read func(C) (T, error)) (T, error) {
	var v T
	err := Do(ctx, p, d, what, func(c C) error {
		var err error
		v, err = read(c)
		return err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

// GCMemoryLimit is the soft memory limit an adaptor gives the Go runtime
// (debug.SetMemoryLimit): half of the host's default cap on an instance's
// linear memory (256 MiB). Without it the collector lets the heap grow to
// twice what its last cycle found live, and commits of thousands of ops (a
// DeleteRange of 5,000 keys is 10,000 ops, 6.5 MB) ran instances out of
// memory on a loaded machine (DESIGN.md: "Statements per round trip in the
// SQL adaptors"); linear memory never shrinks, so the heap must not outgrow
// it in the first place.
const GCMemoryLimit = 128 << 20
