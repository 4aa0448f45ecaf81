package election

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// watchdog only turns a deadlock of a test into a failure; no test measures
// wall-clock time.
const watchdog = 30 * time.Second

// timeline is a fake time shared by the electors of a test. Time moves only
// in advance, which fires the due tickers and timers one at a time, in time
// order (ties in creation order), and after each one waits until the loop
// it woke is idle again. Every elector has its own view (a fakeClock), so
// the timeline knows whose loop an event wakes; with one woken at a time,
// a test's schedule is fully deterministic.
type timeline struct {
	t  *testing.T
	mu sync.Mutex
	// guarded by mu
	now    time.Time
	seq    int
	events []*event
	// check, if set, runs after every event and at the end of advance,
	// with every loop idle: the place for invariants.
	check func()
}

type event struct {
	clock  *fakeClock
	when   time.Time
	period time.Duration // > 0: a ticker
	ch     chan time.Time
	seq    int
}

// t0 is where every timeline starts.
var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func newTimeline(t *testing.T) *timeline {
	return &timeline{t: t, now: t0}
}

// Now is the timeline's current time.
func (tl *timeline) Now() time.Time {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.now
}

// clock returns a new elector's view of the timeline.
func (tl *timeline) clock() *fakeClock {
	return &fakeClock{tl: tl, bell: make(chan struct{}, 1)}
}

// advance moves time forward by d; see timeline.
func (tl *timeline) advance(d time.Duration) {
	tl.t.Helper()
	tl.mu.Lock()
	target := tl.now.Add(d)
	tl.mu.Unlock()
	for {
		tl.mu.Lock()
		ev := tl.due(target)
		if ev == nil {
			tl.now = later(tl.now, target)
			tl.mu.Unlock()
			tl.runCheck()
			return
		}
		// An event that came due while a slow store call passed time
		// fires late, as it would on a busy machine.
		tl.now = later(tl.now, ev.when)
		c := ev.clock
		wake := true
		if ev.period > 0 {
			ev.when = ev.when.Add(ev.period)
			// A tick for a loop that is busy (held in a store call) is
			// dropped, as a real ticker drops the ticks nobody takes.
			wake = c.waiting
		} else {
			tl.remove(ev)
		}
		if wake {
			c.waiting, c.parked = false, false
			select {
			case ev.ch <- tl.now:
			default:
			}
		}
		tl.mu.Unlock()
		if wake {
			c.waitIdle(tl.t)
		}
		tl.runCheck()
	}
}

// pass moves time forward by d without firing anything: the time a store
// call takes. Events that come due fire at the next advance.
func (tl *timeline) pass(d time.Duration) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.now = tl.now.Add(d)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// advanceTo moves time forward to at.
func (tl *timeline) advanceTo(at time.Time) {
	tl.t.Helper()
	d := at.Sub(tl.Now())
	if d < 0 {
		tl.t.Fatalf("advanceTo %v: already at %v", at.Sub(t0), tl.Now().Sub(t0))
	}
	tl.advance(d)
}

func (tl *timeline) runCheck() {
	if tl.check != nil {
		tl.check()
	}
}

// due returns the first event at or before target. mu is held.
func (tl *timeline) due(target time.Time) *event {
	var first *event
	for _, ev := range tl.events {
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
func (tl *timeline) remove(ev *event) bool {
	i := slices.Index(tl.events, ev)
	if i < 0 {
		return false
	}
	tl.events = slices.Delete(tl.events, i, i+1)
	return true
}

// fakeClock is one elector's view of a timeline. Its loop is idle when it
// waits for its ticker (the loop calls the ticker's C only then) or is
// parked in a store call a test holds.
type fakeClock struct {
	tl *timeline
	// guarded by tl.mu
	waiting bool
	parked  bool
	// bell rings when the loop may have become idle.
	bell chan struct{}
}

var _ Clock = (*fakeClock)(nil)

func (c *fakeClock) Now() time.Time { return c.tl.Now() }

func (c *fakeClock) NewTicker(d time.Duration) Ticker {
	return &fakeTicker{c.add(d, d)}
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	if d <= 0 {
		ch := make(chan time.Time, 1)
		ch <- c.Now()
		return &fakeTimer{&event{clock: c, ch: ch}}
	}
	return &fakeTimer{c.add(d, 0)}
}

func (c *fakeClock) add(d, period time.Duration) *event {
	tl := c.tl
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.seq++
	ev := &event{clock: c, when: tl.now.Add(d), period: period, ch: make(chan time.Time, 1), seq: tl.seq}
	tl.events = append(tl.events, ev)
	return ev
}

// park marks the loop as held in a store call; the store wrapper that holds
// it calls this.
func (c *fakeClock) park() {
	c.tl.mu.Lock()
	c.parked = true
	c.tl.mu.Unlock()
	c.ring()
}

func (c *fakeClock) ring() {
	select {
	case c.bell <- struct{}{}:
	default:
	}
}

// waitIdle waits until the loop waits for its ticker or is parked.
func (c *fakeClock) waitIdle(t *testing.T) {
	t.Helper()
	deadline := time.After(watchdog)
	for {
		c.tl.mu.Lock()
		idle := c.waiting || c.parked
		c.tl.mu.Unlock()
		if idle {
			return
		}
		select {
		case <-c.bell:
		case <-deadline:
			t.Fatal("election loop did not become idle")
		}
	}
}

type fakeTicker struct{ ev *event }

// C marks the loop idle: the loop calls it when it starts waiting.
func (t *fakeTicker) C() <-chan time.Time {
	c := t.ev.clock
	c.tl.mu.Lock()
	c.waiting = true
	c.tl.mu.Unlock()
	c.ring()
	return t.ev.ch
}

func (t *fakeTicker) Stop() {
	t.ev.clock.tl.mu.Lock()
	defer t.ev.clock.tl.mu.Unlock()
	t.ev.clock.tl.remove(t.ev)
}

type fakeTimer struct{ ev *event }

func (t *fakeTimer) C() <-chan time.Time { return t.ev.ch }

func (t *fakeTimer) Stop() bool {
	t.ev.clock.tl.mu.Lock()
	defer t.ev.clock.tl.mu.Unlock()
	return t.ev.clock.tl.remove(t.ev)
}
