package election

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/engramkv/engram/core/internal/clock"
	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// The election loop is a small state machine. Each state is one step that
// returns the next state:
//
//	follow ──(record absent, malformed, ours, or unchanged for a lease)──▶ claim
//	follow ──(otherwise: follow its holder)──────────────────────────────▶ wait
//	claim  ──(takeover committed: elected)───────────────────────────────▶ wait (leading)
//	claim  ──(committed, but Elected failed: step down)──────────────────▶ wait
//	claim  ──(conflict, error, uncertain answer)─────────────────────────▶ wait
//	renew  ──(renewed, or failed within the lease)───────────────────────▶ wait
//	renew  ──(lost compare-and-swap, another holder: step down)──────────▶ wait
//	renew  ──(record absent or malformed: step down)─────────────────────▶ claim
//	wait   ──(tick, or a hand-off asked for)─────────────────────────────▶ renew if leading, else follow
//	wait   ──(lease ended: step down)────────────────────────────────────▶ wait
//	any    ──(ctx ended)─────────────────────────────────────────────────▶ stop
//
// A round (follow or renew, maybe claim) starts at once and then every
// RenewInterval, and also at once when a hand-off is asked for.
type state uint8

const (
	// stateFollow: not leading. Read the lease record; follow its holder, or
	// claim it.
	stateFollow state = iota
	// stateClaim: write a new lease and term record over the lease record
	// this round read.
	stateClaim
	// stateRenew: leading. Read the lease record and renew it.
	stateRenew
	// stateWait: wait for the next round; a leader also waits for the end of
	// its lease and steps down there.
	stateWait
	// stateStop: ctx ended; Run returns (a leader steps down).
	stateStop
)

func (s state) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

var stateNames = [...]string{stateFollow: "follow", stateClaim: "claim", stateRenew: "renew", stateWait: "wait", stateStop: "stop"}

// loop is the state of one Run, owned by its goroutine. What Fence, Leader
// and IsLeader need is published to the Elector under its mutex.
type loop struct {
	e      *Elector
	cb     Callbacks
	clock  clock.Clock
	ticker clock.Ticker

	// This round: when it began (before the lease record was read) and what
	// it read.
	start time.Time
	cur   []byte // the lease record; nil when absent
	rec   Record // cur decoded; zero when absent or malformed
	bad   bool   // cur is malformed

	// Following: the lease record as it last changed, and when this node
	// first saw it so (zero: nothing to time yet).
	seen       []byte
	observedAt time.Time

	// Leading: stopLeading is non-nil while this node leads and ends the
	// context given to Elected.
	stopLeading context.CancelFunc
	term        int64
	renewedAt   time.Time // start of the round of the last renewal or of the takeover
}

// Run takes part in the election until ctx ends; a leader steps down then.
func (e *Elector) Run(ctx context.Context, cb Callbacks) {
	l := &loop{e: e, cb: cb, clock: e.clock, ticker: e.clock.NewTicker(e.opts.RenewInterval)}
	defer l.ticker.Stop()
	defer l.stepDown("shutting down")
	for st := stateFollow; st != stateStop; {
		st = l.step(ctx, st)
	}
}

func (l *loop) step(ctx context.Context, st state) state {
	if int(st) < len(steps) && steps[st] != nil {
		return steps[st](l, ctx)
	}
	panic(fmt.Sprintf("election: no step for state %v", st))
}

// steps is what each state but stateStop does: one step, which returns the
// next state.
var steps = [...]func(*loop, context.Context) state{
	stateFollow: (*loop).follow,
	stateClaim:  (*loop).claim,
	stateRenew:  (*loop).renew,
	stateWait:   (*loop).wait,
}

// follow is a round of a node that does not lead.
func (l *loop) follow(ctx context.Context) state {
	if err := l.read(ctx); err != nil {
		if ctx.Err() != nil {
			return stateStop
		}
		l.e.log.Warn("election: reading the lease record failed", "err", err)
		if !l.observedAt.IsZero() && l.since(l.observedAt) >= l.e.opts.LeaseDuration {
			// The leader we knew has not been seen renewing for a whole
			// lease: it may be gone.
			l.setLeader(Record{}, false)
		}
		return stateWait
	}
	if !l.claimable() {
		l.observe()
		return stateWait
	}
	if l.e.candidate(ctx) {
		return stateClaim
	}
	// A learner: no one leads that it may follow, and it does not
	// campaign. It keeps timing the record as a candidate would, so a new
	// leader's record is followed at once.
	if !bytes.Equal(l.cur, l.seen) {
		l.seen, l.observedAt = l.cur, l.clock.Now()
	}
	l.setLeader(Record{}, false)
	return stateWait
}

// claimable reports whether the record this round read may be claimed: no
// leader, our own previous incarnation, a hand-off to us, or a holder that
// has not renewed for a whole lease.
func (l *loop) claimable() bool {
	switch {
	case l.cur == nil, l.bad, l.rec.Holder == l.e.opts.ID && l.rec.Handoff == "":
		return true
	case l.rec.Handoff == l.e.opts.ID:
		return true
	case bytes.Equal(l.cur, l.seen) && !l.observedAt.IsZero() && l.since(l.observedAt) >= l.e.opts.LeaseDuration:
		return true
	}
	return false
}

// observe follows the record this round read, timing it from now if it
// changed.
func (l *loop) observe() {
	if bytes.Equal(l.cur, l.seen) {
		return
	}
	l.seen, l.observedAt = l.cur, l.clock.Now()
	if l.rec.Handoff != "" {
		// The holder no longer serves; its target has not claimed yet.
		l.setLeader(Record{}, false)
		return
	}
	l.setLeader(l.rec, true)
}

// claim takes over the lease record this round read.
func (l *loop) claim(ctx context.Context) state {
	term, err := l.e.takeOver(ctx, l.cur, l.rec)
	if err != nil {
		if ctx.Err() != nil {
			return stateStop
		}
		if _, lost := kv.AsConflict(err); !lost {
			l.e.log.Warn("election: taking over failed", "err", err)
		}
		if l.cur != nil && l.rec.Holder != l.e.opts.ID || l.knownSelf() {
			// The holder stopped renewing, or this node just stepped
			// down, and we could not take over: no leader is known now.
			// (After an uncertain answer the record may name us; the
			// next round claims it again.)
			l.setLeader(Record{}, false)
		}
		return stateWait
	}
	l.lead(ctx, term)
	return stateWait
}

// lead makes this node leader at term, from the start of this round.
func (l *loop) lead(ctx context.Context, term int64) {
	lctx, cancel := context.WithCancel(ctx)
	l.stopLeading, l.term, l.renewedAt = cancel, term, l.start
	l.seen, l.observedAt = nil, time.Time{}
	l.e.mu.Lock()
	l.e.leading, l.e.term, l.e.renewedAt = true, term, l.start
	l.e.mu.Unlock()
	l.setLeader(Record{Holder: l.e.opts.ID, URL: l.e.currentURL(), Term: term}, true)
	l.e.log.Info("elected leader", "term", term)
	if l.cb.Elected != nil {
		if err := l.cb.Elected(lctx, term); err != nil {
			l.stepDown(fmt.Sprintf("taking up leadership failed: %v", err))
			l.setLeader(Record{}, false)
		}
	}
}

// renew is a round of the leader.
func (l *loop) renew(ctx context.Context) state {
	if err := l.read(ctx); err != nil {
		if ctx.Err() != nil {
			return stateStop
		}
		// wait steps down if the lease ended.
		l.e.log.Warn("election: reading the lease record failed", "err", err)
		return stateWait
	}
	switch {
	case l.cur == nil || l.bad:
		l.stepDown("lease record changed")
		return stateClaim
	case l.rec.Holder != l.e.opts.ID || l.rec.Term != l.term:
		// Another node, or another incarnation of this one (the same ID
		// twice), took over.
		l.stepDown("another node holds the lease")
		l.observe()
		return stateWait
	}
	if req := l.e.takeHandoff(); req != nil {
		return l.handOff(ctx, req)
	}
	next := l.rec
	next.Renewals++
	// A changed peer URL (SetURL) goes out with the renewal: followers
	// see a changed record and forward to the new URL.
	next.URL = l.e.currentURL()
	ops := []kv.Op{kv.CompareAndSwap(coder.MetaKey(leaseName), l.cur, next.encode()), FenceOp(l.term)}
	_, err := bounded(ctx, l.clock, l.deadline(), func(ctx context.Context) (struct{}, error) {
		return struct{}{}, l.e.opts.Store.Commit(ctx, ops)
	})
	switch {
	case err == nil:
		l.renewedAt = l.start
		l.e.mu.Lock()
		l.e.renewedAt = l.start
		l.e.mu.Unlock()
	case ctx.Err() != nil:
		return stateStop
	default:
		if _, lost := kv.AsConflict(err); lost {
			l.stepDown("another node took over")
			l.setLeader(Record{}, false)
		} else {
			// An error or an uncertain answer: the renewal may not have
			// happened, so the lease still runs from the last one; wait
			// steps down when it ends.
			l.e.log.Warn("election: renewing the lease failed", "err", err)
		}
	}
	return stateWait
}

// wait waits for the next round. A leader whose lease ends first steps down
// at that moment.
func (l *loop) wait(ctx context.Context) state {
	var leaseEnd <-chan time.Time
	if l.stopLeading != nil {
		left := l.deadline().Sub(l.clock.Now())
		if left <= 0 {
			l.leaseEnded()
		} else {
			t := l.clock.NewTimer(left)
			defer t.Stop()
			leaseEnd = t.C()
		}
	}
	select {
	case <-ctx.Done():
		return stateStop
	case <-leaseEnd:
		l.leaseEnded()
		return stateWait
	case <-l.ticker.C():
	case <-l.e.wake:
	}
	if l.stopLeading != nil {
		return stateRenew
	}
	return stateFollow
}

func (l *loop) leaseEnded() {
	l.stepDown("the lease ended before a renewal succeeded")
	l.setLeader(Record{}, false)
}

// read starts a round: it notes the time and reads and decodes the lease
// record. A leader's read is bounded by the end of its lease.
func (l *loop) read(ctx context.Context) error {
	l.start = l.clock.Now()
	l.cur, l.rec, l.bad = nil, Record{}, false
	cur, err := bounded(ctx, l.clock, l.deadline(), func(ctx context.Context) ([]byte, error) {
		return l.e.opts.Store.Get(ctx, coder.MetaKey(leaseName))
	})
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	l.cur = cur
	if l.rec, err = decodeRecord(cur); err != nil {
		l.e.log.Error("election: lease record is malformed; taking over", "err", err)
		l.rec, l.bad = Record{}, true
	}
	return nil
}

// stepDown ends this node's leadership, if it leads.
func (l *loop) stepDown(why string) {
	if l.stopLeading == nil {
		return
	}
	l.e.log.Warn("stepping down", "reason", why)
	l.stopLeading()
	l.stopLeading = nil
	l.e.mu.Lock()
	l.e.leading = false
	// A hand-off not yet taken cannot happen any more.
	req := l.e.handoff
	l.e.handoff = nil
	l.e.mu.Unlock()
	if req != nil {
		req.done <- ErrNotLeader
	}
	if l.cb.SteppedDown != nil {
		l.cb.SteppedDown()
	}
}

// setLeader records the known leader and reports a change.
func (l *loop) setLeader(r Record, ok bool) {
	e := l.e
	e.mu.Lock()
	// A renewal that moved the leader's URL (SetURL) is a change too:
	// followers must forward to the new URL.
	changed := ok != e.known || r.Holder != e.leader.Holder || r.Term != e.leader.Term || r.URL != e.leader.URL
	e.leader, e.known = r, ok
	if changed {
		close(e.changed)
		e.changed = make(chan struct{})
	}
	e.mu.Unlock()
	if changed && l.cb.LeaderChanged != nil {
		l.cb.LeaderChanged(r, ok)
	}
}

// knownSelf reports whether the known leader is this node.
func (l *loop) knownSelf() bool {
	l.e.mu.Lock()
	defer l.e.mu.Unlock()
	return l.e.known && l.e.leader.Holder == l.e.opts.ID
}

// deadline is when a leader's lease ends; zero when not leading.
func (l *loop) deadline() time.Time {
	if l.stopLeading == nil {
		return time.Time{}
	}
	return l.renewedAt.Add(l.e.opts.LeaseDuration)
}

func (l *loop) since(t time.Time) time.Duration { return l.clock.Now().Sub(t) }

// errLeaseEnded is a leader's store call abandoned at the end of its lease.
var errLeaseEnded = errors.New("election: the lease ended before the store answered")

// bounded runs f, but no longer than until deadline (zero: no bound): a
// leader must not stay blocked in a store call past its lease, or it would
// step down late. At the deadline it cancels f's context and returns
// errLeaseEnded without waiting for f, which may still apply its batch
// later; a late renewal only extends a record this node no longer counts
// on, and the next round claims it again.
func bounded[T any](ctx context.Context, clk clock.Clock, deadline time.Time, f func(context.Context) (T, error)) (T, error) {
	if deadline.IsZero() {
		return f(ctx)
	}
	var zero T
	left := deadline.Sub(clk.Now())
	if left <= 0 {
		return zero, errLeaseEnded
	}
	// The timer exists before f runs, so a test that sees f blocked can
	// move its clock to the deadline.
	t := clk.NewTimer(left)
	defer t.Stop()
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f(fctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-t.C():
		return zero, errLeaseEnded
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}
