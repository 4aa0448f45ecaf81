// Package retry resolves writes whose commit returned kv.ErrUncertain: the
// engine could not tell whether the batch was applied (a timeout after the
// commit was sent, an undetermined distributed commit).
//
// It owns one decision, made by reading back a witness key that only the
// uncertain batch writes (or removes): applied, or not applied. It retries
// the read with backoff until the store answers, because either answer is
// final only once read from the store itself.
//
// Ordering is the caller's: the MVCC writer resolves an uncertain batch
// before it commits the next one and before it publishes the batch's
// revision. That is what keeps revisions dense (a revision that did not
// happen is never followed by one that did), keeps watch events in revision
// order with no gap, and keeps compaction from ever passing an unresolved
// revision (compaction targets only published revisions). The cost is that
// writes queue behind an unresolved one; they are acknowledged in order once
// it resolves. The alternatives, and why they lose: (DESIGN.md, "Uncertain
// commits"). This package must not decide anything about revisions.
package retry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/engramkv/engram/core/kv"
)

// Witness names the key whose state after the batch proves it was applied.
type Witness struct {
	Key []byte
	// Value is the value the batch wrote to Key; when Removed is set the
	// batch deleted Key instead.
	Value   []byte
	Removed bool
}

// ErrNotApplied is returned when the read-back shows the batch was not
// applied.
var ErrNotApplied = errors.New("retry: uncertain commit was not applied")

// Options tune the read-back.
type Options struct {
	// MaxBackoff caps the wait between read attempts.
	MaxBackoff time.Duration
	Logger     *slog.Logger
}

// Resolve reads w back until the store answers. It returns nil when the
// batch was applied, ErrNotApplied when it was not, and ctx's error (or
// kv.ErrClosed) when it has to give up without an answer.
func Resolve(ctx context.Context, store kv.Store, w Witness, opts Options) error {
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	backoff := 10 * time.Millisecond
	for attempt := 1; ; attempt++ {
		v, err := store.Get(ctx, w.Key)
		switch {
		case err == nil:
			if !w.Removed && bytes.Equal(v, w.Value) {
				return nil
			}
			return ErrNotApplied
		case errors.Is(err, kv.ErrNotFound):
			if w.Removed {
				return nil
			}
			return ErrNotApplied
		case errors.Is(err, kv.ErrClosed):
			return err
		}
		opts.Logger.Warn("reading back an uncertain commit failed; retrying", "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("retry: giving up on an uncertain commit: %w", ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, opts.MaxBackoff)
	}
}
