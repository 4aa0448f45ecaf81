package election

import "time"

// Clock is the elector's source of time. Every reading of the time and every
// wait of the elector (the lease checks of Fence included) goes through it,
// so tests can drive the election on a fake timeline. Only differences
// between its readings matter; the real clock's are monotonic.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTicker returns a ticker that ticks every d. The election loop has
	// one ticker and calls its C once each time it starts waiting for the
	// next tick, and nowhere else: a fake clock may take that call as "the
	// loop is idle".
	NewTicker(d time.Duration) Ticker
	// NewTimer returns a timer that fires once, d from now (at once for
	// d <= 0).
	NewTimer(d time.Duration) Timer
}

// Ticker delivers ticks on C; ticks the receiver is too slow for are
// dropped, as with time.Ticker.
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

// realClock is the system clock, the default.
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
