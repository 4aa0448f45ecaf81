package periodic

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestRoundsUntilStop: rounds repeat; Stop cancels the round under way,
// waits for it, and no round starts after.
func TestRoundsUntilStop(t *testing.T) {
	var rounds atomic.Int32
	second := make(chan struct{})
	task := Start(time.Millisecond, func(ctx context.Context) {
		if rounds.Add(1) == 2 {
			close(second)
			<-ctx.Done() // a long round, ended by Stop
		}
	})
	<-second
	task.Stop()
	select {
	case <-task.Done():
	default:
		t.Fatal("Stop returned before the task ended")
	}
	if n := rounds.Load(); n != 2 {
		t.Fatalf("%d rounds, want 2 (none after Stop)", n)
	}
	task.Stop() // a second Stop is harmless
}

// TestStopNil: a store whose task is off holds a nil Task.
func TestStopNil(t *testing.T) {
	var task *Task
	task.Stop()
}
