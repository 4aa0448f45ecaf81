// Package fakeclock is a fake clock.Clock for tests: time moves only when a
// test advances it, so a test of a loop that waits (a lease that expires, a
// progress ticker, a leader whose lease ends) neither sleeps nor depends on
// how loaded the machine is.
//
// A Clock serves two kinds of loops:
//
//   - Loops given the Clock itself. Advance fires their timers and hands
//     each due tick to the loop, waiting until the loop receives it (or
//     stops the ticker), so no tick is lost however slowly the loop runs.
//     What the loop does with it happens after; a test waits for that
//     outcome itself.
//   - Loops given a Loop view of it (see Clock.Loop), which Advance steps
//     one event at a time: after waking such a loop it waits until the loop
//     is idle again, so a test with several of them is fully
//     deterministic. The leader election's tests run that way.
//
// It must not be imported by production code.
package fakeclock

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/engramkv/engram/core/internal/clock"
)

// Watchdog bounds every wait of the fake for a loop: it only turns a
// deadlock of a test into a failure; no test measures wall-clock time.
const Watchdog = 30 * time.Second

// Clock is a fake time. Its zero value is not usable; call New.
type Clock struct {
	tb testing.TB

	mu sync.Mutex
	// guarded by mu
	now    time.Time
	seq    int
	events []*event
	// armed is closed and replaced whenever a timer or ticker is created.
	armed chan struct{}
	check func()
}

var _ clock.Clock = (*Clock)(nil)

// event is a pending timer or ticker.
type event struct {
	loop   *Loop // nil for the Clock's own timers and tickers
	when   time.Time
	period time.Duration // > 0: a ticker
	ch     chan time.Time
	seq    int
	// stopped is closed when a ticker stops, ending a hand-over of its tick.
	stopped  chan struct{}
	stopOnce sync.Once
}

// New returns a Clock at start. Its waits fail tb when a loop does not
// answer within Watchdog.
func New(tb testing.TB, start time.Time) *Clock {
	return &Clock{tb: tb, now: start, armed: make(chan struct{})}
}

// Now returns the fake's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer that fires when the time reaches d from now.
func (c *Clock) NewTimer(d time.Duration) clock.Timer {
	return c.newTimer(nil, d)
}

// NewTicker returns a ticker whose ticks Advance hands over; see Clock.
func (c *Clock) NewTicker(d time.Duration) clock.Ticker {
	if d <= 0 {
		panic("fakeclock: non-positive ticker period")
	}
	// Unbuffered: Advance hands each tick over to the receiver.
	return &ticker{c: c, ev: c.add(nil, d, d, make(chan time.Time))}
}

func (c *Clock) newTimer(l *Loop, d time.Duration) clock.Timer {
	if d <= 0 {
		ch := make(chan time.Time, 1)
		ch <- c.Now()
		return &timer{c: c, ev: &event{loop: l, ch: ch}}
	}
	return &timer{c: c, ev: c.add(l, d, 0, make(chan time.Time, 1))}
}

func (c *Clock) add(l *Loop, d, period time.Duration, ch chan time.Time) *event {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	ev := &event{loop: l, when: c.now.Add(d), period: period, ch: ch, seq: c.seq, stopped: make(chan struct{})}
	c.events = append(c.events, ev)
	close(c.armed)
	c.armed = make(chan struct{})
	return ev
}

// SetCheck sets a function that Advance runs after every event it fires
// and when it returns, with every Loop idle: the place for a test's
// invariants.
func (c *Clock) SetCheck(check func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.check = check
}

// Advance moves the time forward by d. It fires the timers and tickers that
// come due one at a time, in time order (ties in creation order); see Clock
// for what it waits for after each.
func (c *Clock) Advance(d time.Duration) {
	c.tb.Helper()
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		ev := c.due(target)
		if ev == nil {
			c.now = later(c.now, target)
			c.mu.Unlock()
			c.runCheck()
			return
		}
		// An event that came due while Pass moved the time fires late, as
		// it would on a busy machine.
		c.now = later(c.now, ev.when)
		now := c.now
		if ev.period > 0 {
			ev.when = ev.when.Add(ev.period)
		} else {
			c.remove(ev)
		}
		switch l := ev.loop; {
		case l != nil:
			// A tick for a loop that is busy (held in a call) is dropped,
			// as a real ticker drops the ticks nobody takes.
			wake := ev.period == 0 || l.waiting
			if wake {
				l.waiting, l.parked = false, false
				select {
				case ev.ch <- now:
				default:
				}
			}
			c.mu.Unlock()
			if wake {
				l.WaitIdle()
			}
		case ev.period > 0:
			c.mu.Unlock()
			c.handOver(ev, now)
		default:
			ev.ch <- now // buffered, and a timer fires once
			c.mu.Unlock()
		}
		c.runCheck()
	}
}

// handOver waits until the owner of a ticker receives its tick or stops it.
func (c *Clock) handOver(ev *event, now time.Time) {
	c.tb.Helper()
	select {
	case ev.ch <- now:
	case <-ev.stopped:
	case <-time.After(Watchdog):
		c.tb.Fatalf("fakeclock: nobody received the tick at %v", now)
	}
}

// AdvanceTo moves the time forward to at.
func (c *Clock) AdvanceTo(at time.Time) {
	c.tb.Helper()
	d := at.Sub(c.Now())
	if d < 0 {
		c.tb.Fatalf("fakeclock: AdvanceTo %v: already at %v", at, c.Now())
	}
	c.Advance(d)
}

// Pass moves the time forward by d without firing anything: the time a
// store call takes. What comes due fires at the next Advance.
func (c *Clock) Pass(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// WaitArmed waits until a timer or ticker is set to fire at or before at.
// A test calls it before advancing to at, to know that the loop it tests
// has armed the wait that advancing ends: otherwise the loop might read the
// time before the advance and arm its timer after it, too late.
func (c *Clock) WaitArmed(at time.Time) {
	c.tb.Helper()
	deadline := time.After(Watchdog)
	for {
		c.mu.Lock()
		armed := c.armed
		found := slices.ContainsFunc(c.events, func(ev *event) bool { return !ev.when.After(at) })
		c.mu.Unlock()
		if found {
			return
		}
		select {
		case <-armed:
		case <-deadline:
			c.tb.Fatalf("fakeclock: no timer or ticker was set to fire by %v", at)
		}
	}
}

func (c *Clock) runCheck() {
	c.mu.Lock()
	check := c.check
	c.mu.Unlock()
	if check != nil {
		check()
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// due returns the first event at or before target. mu is held.
func (c *Clock) due(target time.Time) *event {
	var first *event
	for _, ev := range c.events {
		if ev.when.After(target) {
			continue
		}
		if first == nil || ev.when.Before(first.when) || ev.when.Equal(first.when) && ev.seq < first.seq {
			first = ev
		}
	}
	return first
}

// remove unregisters ev and reports whether it was registered. mu is held.
func (c *Clock) remove(ev *event) bool {
	i := slices.Index(c.events, ev)
	if i < 0 {
		return false
	}
	c.events = slices.Delete(c.events, i, i+1)
	return true
}

// Loop is one loop's view of a Clock. The loop is idle when it waits for
// its ticker (it calls the ticker's C only then, as clock.Ticker asks) or
// is parked in a call a test holds. After waking it, Advance waits until
// it is idle again, so a loop that stops waiting for good (returns) while a
// test advances the time fails the test after Watchdog.
type Loop struct {
	c *Clock
	// guarded by c.mu
	waiting bool
	parked  bool
	// bell rings when the loop may have become idle.
	bell chan struct{}
}

var _ clock.Clock = (*Loop)(nil)

// Loop returns a new loop's view of c.
func (c *Clock) Loop() *Loop {
	return &Loop{c: c, bell: make(chan struct{}, 1)}
}

// Now returns the fake's current time.
func (l *Loop) Now() time.Time { return l.c.Now() }

// NewTicker returns a ticker whose C marks the loop idle.
func (l *Loop) NewTicker(d time.Duration) clock.Ticker {
	if d <= 0 {
		panic("fakeclock: non-positive ticker period")
	}
	return &loopTicker{l: l, ev: l.c.add(l, d, d, make(chan time.Time, 1))}
}

// NewTimer returns a timer whose firing wakes the loop.
func (l *Loop) NewTimer(d time.Duration) clock.Timer { return l.c.newTimer(l, d) }

// Park marks the loop as held in a call; the wrapper that holds the call
// calls it.
func (l *Loop) Park() {
	l.c.mu.Lock()
	l.parked = true
	l.c.mu.Unlock()
	l.ring()
}

func (l *Loop) ring() {
	select {
	case l.bell <- struct{}{}:
	default:
	}
}

// Wake runs send, which wakes the loop from outside the clock (a channel
// it selects on beside its ticker, e.g. the election's hand-off), and waits
// until the loop is idle again, then runs the check: a wake-up is stepped
// like a tick, so the test stays deterministic.
func (l *Loop) Wake(send func()) {
	l.c.tb.Helper()
	l.c.mu.Lock()
	// A parked loop stays parked: it takes the wake-up once released.
	l.waiting = false
	l.c.mu.Unlock()
	send()
	l.WaitIdle()
	l.c.runCheck()
}

// WaitIdle waits until the loop waits for its ticker or is parked.
func (l *Loop) WaitIdle() {
	l.c.tb.Helper()
	deadline := time.After(Watchdog)
	for {
		l.c.mu.Lock()
		idle := l.waiting || l.parked
		l.c.mu.Unlock()
		if idle {
			return
		}
		select {
		case <-l.bell:
		case <-deadline:
			l.c.tb.Fatal("fakeclock: the loop did not become idle")
		}
	}
}

type ticker struct {
	c  *Clock
	ev *event
}

func (t *ticker) C() <-chan time.Time { return t.ev.ch }

// Stop unregisters the ticker and ends a hand-over of its tick.
func (t *ticker) Stop() {
	t.c.mu.Lock()
	t.c.remove(t.ev)
	t.c.mu.Unlock()
	t.ev.stopOnce.Do(func() { close(t.ev.stopped) })
}

type loopTicker struct {
	l  *Loop
	ev *event
}

// C marks the loop idle: the loop calls it when it starts waiting.
func (t *loopTicker) C() <-chan time.Time {
	t.l.c.mu.Lock()
	t.l.waiting = true
	t.l.c.mu.Unlock()
	t.l.ring()
	return t.ev.ch
}

func (t *loopTicker) Stop() {
	c := t.l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.remove(t.ev)
}

type timer struct {
	c  *Clock
	ev *event
}

func (t *timer) C() <-chan time.Time { return t.ev.ch }

func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	return t.c.remove(t.ev)
}
