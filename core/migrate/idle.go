package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// idleWatch ends a context when the source has sent nothing for a while:
// the base copy waits on one stream (the snapshot) or a run of calls (the
// pages) whose total length depends on the source's size, so a deadline
// cannot bound it, but silence can. A partitioned source otherwise hangs
// the download: gRPC waits for a connection that never comes back.
type idleWatch struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	idle   time.Duration
}

// errIdle is the cause of an idleWatch's context ending.
var errIdle = errors.New("idle")

func newIdleWatch(ctx context.Context, idle time.Duration) *idleWatch {
	w := &idleWatch{idle: idle}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	w.timer = time.AfterFunc(idle, func() { w.cancel(errIdle) })
	return w
}

// touch records that the source sent something.
func (w *idleWatch) touch() { w.timer.Reset(w.idle) }

// stop releases the watch; its context ends.
func (w *idleWatch) stop() {
	w.timer.Stop()
	w.cancel(nil)
}

// err turns an error of a call made with the watch's context into
// ErrSourceIdle when the watch ended it; what says what was being read.
func (w *idleWatch) err(err error, what string) error {
	if errors.Is(context.Cause(w.ctx), errIdle) {
		return fmt.Errorf("%w: nothing from it for %s while reading %s (set a longer --idle-timeout if the source is only slow)", ErrSourceIdle, w.idle, what)
	}
	return err
}

// notSupported reports whether the source answered that it does not serve
// a call: Unimplemented, or, as kine answers Snapshot, HashKV and the lease
// calls, an error whose message says "not supported".
func notSupported(err error) bool {
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	if s.Code() == codes.Unimplemented {
		return true
	}
	msg := s.Message()
	return s.Code() == codes.Unknown && (strings.Contains(msg, "not supported") || strings.Contains(msg, "not implemented"))
}
