// Package clock is the core's source of time for its background loops: lease
// expiry, watch progress notifications, the compaction policy and the
// leader election read the time and wait only through a Clock, so that tests
// can drive them on a fake timeline (package fakeclock) instead of sleeping.
//
// It owns the interface and the system clock, nothing else; production code
// uses Real and must not import fakeclock.
package clock

import "time"

// Clock reads the time and makes timers and tickers. Only differences
// between its readings matter; the real clock's are monotonic.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTicker returns a ticker that ticks every d.
	NewTicker(d time.Duration) Ticker
	// NewTimer returns a timer that fires once, d from now (at once for
	// d <= 0).
	NewTimer(d time.Duration) Timer
}

// Ticker delivers ticks on C; ticks the receiver is too slow for are
// dropped, as with time.Ticker.
//
// A loop that waits for ticks calls C each time it starts waiting (in its
// select statement), and nowhere else: a fake clock may take that call as
// "the loop is idle".
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Timer delivers one value on C when it fires.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
}

// Real is the system clock, every loop's default.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }
