// Package gate is a store's closed state and the lock that makes its Close
// wait for the calls in flight: every call that touches the engine enters
// the gate shared, Close takes it exclusively, so nothing touches the
// engine after it is closed.
//
// It must not know any engine. A store with more states than open and
// closed (badger, whose bulk load also shuts calls out) keeps its own.
package gate

import (
	"sync"

	"github.com/engramkv/engram/core/kv"
)

// Gate is open until Close. Its zero value is open and ready to use.
type Gate struct {
	mu     sync.RWMutex
	closed bool
}

// Enter returns kv.ErrClosed once the store is closed. Otherwise it holds
// off Close until Exit.
func (g *Gate) Enter() error {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return kv.ErrClosed
	}
	return nil
}

// EnterKey is Enter for a call on one key. An empty key, which no store
// can hold, answers kv.ErrNotFound once the gate is entered, and leaves it
// again; a closed store still answers kv.ErrClosed first.
func (g *Gate) EnterKey(key []byte) error {
	if err := g.Enter(); err != nil {
		return err
	}
	if len(key) == 0 {
		g.Exit()
		return kv.ErrNotFound
	}
	return nil
}

// Exit ends what a successful Enter began.
func (g *Gate) Exit() { g.mu.RUnlock() }

// Close waits for the calls in flight, marks the store closed and runs
// shut (nil for nothing) before any later call learns that it is closed.
// A second Close returns kv.ErrClosed and does not run shut.
func (g *Gate) Close(shut func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return kv.ErrClosed
	}
	g.closed = true
	if shut == nil {
		return nil
	}
	return shut()
}
