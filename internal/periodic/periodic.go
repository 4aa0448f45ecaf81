// Package periodic runs a background task every interval until it is
// stopped: badger's value-log GC and TiKV's MVCC GC (until the store's
// Close), a bulk load's release of mapped pages, the auth state's poll of
// its revision record, a test client's pace. It owns the ticker and the
// stopping; it must not know what the task does.
package periodic

import (
	"context"
	"time"
)

// Task is a round run every interval until Stop.
type Task struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs round every interval, the first time one interval from now,
// in a goroutine of its own. round's context is cancelled by Stop, so a
// long round can end early.
func Start(interval time.Duration, round func(ctx context.Context)) *Task {
	ctx, cancel := context.WithCancel(context.Background())
	t := &Task{cancel: cancel, done: make(chan struct{})}
	go t.run(ctx, interval, round)
	return t
}

func (t *Task) run(ctx context.Context, interval time.Duration, round func(ctx context.Context)) {
	defer close(t.done)
	Run(ctx, interval, round)
}

// Run runs round every interval, the first time one interval from now, on
// the caller's goroutine, until ctx ends. Ticks missed while a round runs
// are dropped: the rounds are paced, not counted.
func Run(ctx context.Context, interval time.Duration, round func(ctx context.Context)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		round(ctx)
	}
}

// Stop ends the task and waits for the round under way, if any. It is
// safe to call more than once, and on a nil Task (none was started).
func (t *Task) Stop() {
	if t == nil {
		return
	}
	t.cancel()
	<-t.done
}

// Done is closed once the task has ended.
func (t *Task) Done() <-chan struct{} { return t.done }
