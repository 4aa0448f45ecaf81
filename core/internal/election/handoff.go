package election

import (
	"context"
	"errors"
	"fmt"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// handoffReq is a hand-off asked of the loop; done gets the result of
// writing the hand-off record (nil: written).
type handoffReq struct {
	target string
	done   chan error
}

// ErrHandoffFailed is returned by Handoff when the target did not become
// leader: the context ended first, or another node took over.
var ErrHandoffFailed = errors.New("election: the target did not take over")

// Handoff hands leadership to the node with ID target and returns once this
// node knows target leads. It fails with ErrNotLeader when this node does
// not lead; a target equal to this node's ID is already leader. From the
// call on this node serves no writes (Fence fails); if ctx ends before the
// loop wrote the hand-off, leadership stays here. written, if not nil, is
// called once the hand-off record is committed: the moment to ask the
// target to look now (its Wake) rather than at its next round.
func (e *Elector) Handoff(ctx context.Context, target string, written func()) error {
	req, err := e.askHandoff(target)
	if err != nil || req == nil {
		return err
	}
	return e.finishHandoff(ctx, req, written)
}

// Wake runs a round of the loop now instead of at its next tick. A node
// that changed the lease record (wrote a hand-off, took over) asks its
// peers for it, so that they learn without waiting up to a renew interval:
// the target of a hand-off claims at once, followers find the new leader.
// Wakes coalesce (at most one extra round is pending however many arrive),
// and a round costs one read of the lease record; a round never shortens
// the wait before a takeover, which is timed from when a record was first
// seen.
func (e *Elector) Wake() { e.wakeLoop() }

// askHandoff leaves the hand-off to a renewal round of the loop, which it
// wakes at once: from now on Fence fails, so every moment until the round
// is a moment without writes. nil without an error: target is this node,
// already leader.
func (e *Elector) askHandoff(target string) (*handoffReq, error) {
	req, err := e.setHandoff(target)
	if req != nil {
		e.wakeLoop()
	}
	return req, err
}

func (e *Elector) setHandoff(target string) (*handoffReq, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case !e.leading:
		return nil, ErrNotLeader
	case target == e.opts.ID:
		return nil, nil
	case e.handoff != nil:
		return nil, fmt.Errorf("election: a hand-off to %q is under way", e.handoff.target)
	}
	req := &handoffReq{target: target, done: make(chan error, 1)}
	e.handoff = req
	return req, nil
}

// signalWake makes the loop's wait end now instead of at its next tick.
// One pending wake-up is enough: the round it starts sees every request
// made before it.
func (e *Elector) signalWake() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// finishHandoff waits for the loop to write the hand-off, then for the
// target to lead.
func (e *Elector) finishHandoff(ctx context.Context, req *handoffReq, written func()) error {
	select {
	case err := <-req.done:
		if err != nil {
			return fmt.Errorf("election: write the hand-off to %q: %w", req.target, err)
		}
	case <-ctx.Done():
		e.mu.Lock()
		taken := e.handoff != req
		if !taken {
			e.handoff = nil
		}
		e.mu.Unlock()
		if !taken {
			return fmt.Errorf("%w: %w", ErrHandoffFailed, ctx.Err())
		}
		if err := <-req.done; err != nil {
			return fmt.Errorf("election: write the hand-off to %q: %w", req.target, err)
		}
	}
	if written != nil {
		written()
	}
	return e.awaitLeader(ctx, req.target)
}

// awaitLeader waits until the known leader is target.
func (e *Elector) awaitLeader(ctx context.Context, target string) error {
	for {
		e.mu.Lock()
		r, known, changed := e.leader, e.known, e.changed
		e.mu.Unlock()
		if known && r.Holder == target {
			return nil
		}
		if known && r.Handoff == "" {
			return fmt.Errorf("%w: %q leads instead", ErrHandoffFailed, r.Holder)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrHandoffFailed, ctx.Err())
		}
	}
}

// takeHandoff returns the pending hand-off, if any, and marks it taken.
func (e *Elector) takeHandoff() *handoffReq {
	e.mu.Lock()
	defer e.mu.Unlock()
	req := e.handoff
	e.handoff = nil
	if req != nil {
		// Fence keeps failing through leading until the step-down.
		e.leading = false
	}
	return req
}

// handOff is a leader's round that hands off instead of renewing: it steps
// down, then writes the record naming req.target, fenced with its term.
func (l *loop) handOff(ctx context.Context, req *handoffReq) state {
	l.stepDown(fmt.Sprintf("handing leadership to %q", req.target))
	next := l.rec
	next.Renewals++
	next.Handoff = req.target
	enc := next.encode()
	err := l.e.opts.Store.Commit(ctx, []kv.Op{kv.CompareAndSwap(coder.MetaKey(leaseName), l.cur, enc), FenceOp(l.term)})
	// No leader is known from here on, and Handoff must see that: told
	// first, it could read this node's own record as the known leader and
	// answer that someone other than the target leads.
	l.setLeader(Record{}, false)
	req.done <- err
	if err != nil {
		if ctx.Err() != nil {
			return stateStop
		}
		// The record may still name this node without a hand-off: the next
		// round takes it over again (a new term), as after a restart.
		l.e.log.Warn("election: writing the hand-off failed", "target", req.target, "err", err)
		return stateWait
	}
	// Time the record from one round early, so that this node claims it
	// back within one lease if the target never does (package doc).
	l.seen, l.observedAt = enc, l.start.Add(-l.e.opts.RenewInterval)
	l.e.log.Info("handed leadership off", "target", req.target, "term", l.term)
	return stateWait
}
