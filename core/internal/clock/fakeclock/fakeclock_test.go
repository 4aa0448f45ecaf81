package fakeclock

import (
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func TestTimerFiresWhenDue(t *testing.T) {
	c := New(t, t0)
	tm := c.NewTimer(time.Second)
	c.Advance(time.Second - time.Nanosecond)
	select {
	case <-tm.C():
		t.Fatal("timer fired early")
	default:
	}
	c.Advance(time.Nanosecond)
	if at := <-tm.C(); !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("fired at %v", at)
	}
	if tm.Stop() {
		t.Fatal("Stop of a fired timer reported stopping it")
	}
	stopped := c.NewTimer(time.Second)
	if !stopped.Stop() {
		t.Fatal("Stop of a pending timer reported it had fired")
	}
	c.Advance(time.Hour)
	select {
	case <-stopped.C():
		t.Fatal("stopped timer fired")
	default:
	}
	if now := <-c.NewTimer(0).C(); !now.Equal(c.Now()) {
		t.Fatalf("zero timer fired at %v, now %v", now, c.Now())
	}
}

// TestTickerHandsOverEveryTick: Advance returns only once the receiver took
// each due tick, so none is dropped however slow the receiver is.
func TestTickerHandsOverEveryTick(t *testing.T) {
	c := New(t, t0)
	tk := c.NewTicker(time.Second)
	got := make(chan []time.Time)
	go func() {
		var ticks []time.Time
		for range 3 {
			ticks = append(ticks, <-tk.C())
		}
		got <- ticks
	}()
	c.Advance(3 * time.Second)
	ticks := <-got
	for i, at := range ticks {
		if want := t0.Add(time.Duration(i+1) * time.Second); !at.Equal(want) {
			t.Fatalf("tick %d at %v, want %v", i, at, want)
		}
	}
	// A stopped ticker's tick is not waited for.
	tk.Stop()
	c.Advance(time.Minute)
}

func TestWaitArmed(t *testing.T) {
	c := New(t, t0)
	armed := make(chan struct{})
	go func() {
		c.WaitArmed(t0.Add(time.Minute))
		close(armed)
	}()
	c.NewTimer(time.Hour) // too late: does not end the wait
	tm := c.NewTimer(time.Minute)
	<-armed
	c.AdvanceTo(t0.Add(time.Minute))
	<-tm.C()
}

// TestLoopSteps: Advance wakes a Loop's loop and returns only once the loop
// waits for its ticker again, so the test reads the loop's state between
// ticks without a race.
func TestLoopSteps(t *testing.T) {
	c := New(t, t0)
	l := c.Loop()
	tk := l.NewTicker(time.Second)
	defer tk.Stop()
	rounds := 0 // written by the loop, read by the test only while it is idle
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-tk.C(): // C marks the loop idle
				rounds++
			case <-quit:
				return
			}
		}
	}()
	defer func() {
		close(quit)
		<-done
	}()
	l.WaitIdle()
	for want := 1; want <= 3; want++ {
		c.Advance(time.Second)
		if rounds != want {
			t.Fatalf("after %d ticks the loop ran %d rounds", want, rounds)
		}
	}
}
