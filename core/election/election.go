// Package election elects one leader among Engram nodes that share a store,
// using only the kv.Store contract, and fences a deposed leader's writes.
//
// It owns two records: the lease record (who leads, at which term, and a
// renewal counter the leader bumps every RenewInterval with a
// compare-and-swap) and the term record (the current term, written only when
// leadership changes). It does not decide what a leader does; the server
// reacts to its callbacks.
//
// # Safety
//
// No clock is shared between nodes; each node only measures durations on its
// own monotonic clock:
//
//   - The leader counts itself leader until LeaseDuration after the start of
//     its last successful renewal. It stops writing at that point even when
//     it cannot reach the store.
//   - A candidate takes over only after it has seen the same lease record for
//     LeaseDuration. It first saw that record after the renewal that wrote it
//     committed, so the old leader's own deadline has passed by then (given
//     clocks that run at about the same rate).
//   - Fencing backs up the timing argument: every write batch of a leader
//     carries FenceOp, a compare of the term record against its own term.
//     Taking over rewrites the term record in the same batch as the lease
//     record, so once a new leader exists every batch of the old one fails
//     whole, whatever the clocks did.
//
// A node that restarts with the same ID as the recorded holder (the same
// process name on the same store) takes over at once with a new term: the
// previous holder was itself.
package election

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/engramkv/engram/core/coder"
	"github.com/engramkv/engram/core/kv"
)

const (
	leaseName = "election/lease"
	termName  = "election/term"
	format    = 1
)

// Record is the content of the lease record.
type Record struct {
	// Holder is the leader's node ID.
	Holder string
	// URL is the leader's advertised client URL, where followers forward.
	URL string
	// Term increases by one at every change of leader.
	Term int64
	// Renewals counts the leader's renewals in this term.
	Renewals uint64
}

func (r Record) encode() []byte {
	b := []byte{format}
	b = binary.AppendUvarint(b, uint64(r.Term))
	b = binary.AppendUvarint(b, r.Renewals)
	b = binary.AppendUvarint(b, uint64(len(r.Holder)))
	b = append(b, r.Holder...)
	b = binary.AppendUvarint(b, uint64(len(r.URL)))
	return append(b, r.URL...)
}

var errBadRecord = errors.New("election: malformed record")

func decodeRecord(b []byte) (Record, error) {
	var r Record
	if len(b) < 1 || b[0] != format {
		return r, errBadRecord
	}
	b = b[1:]
	term, n := binary.Uvarint(b)
	if n <= 0 {
		return r, errBadRecord
	}
	b = b[n:]
	if r.Renewals, n = binary.Uvarint(b); n <= 0 {
		return r, errBadRecord
	}
	b = b[n:]
	r.Term = int64(term)
	var err error
	if r.Holder, b, err = readString(b); err != nil {
		return r, err
	}
	if r.URL, _, err = readString(b); err != nil {
		return r, err
	}
	return r, nil
}

func readString(b []byte) (string, []byte, error) {
	l, n := binary.Uvarint(b)
	if n <= 0 || l > uint64(len(b)-n) {
		return "", nil, errBadRecord
	}
	return string(b[n : n+int(l)]), b[n+int(l):], nil
}

func termValue(term int64) []byte {
	return binary.BigEndian.AppendUint64([]byte{format}, uint64(term))
}

func decodeTerm(b []byte) (int64, error) {
	if len(b) != 9 || b[0] != format {
		return 0, errBadRecord
	}
	return int64(binary.BigEndian.Uint64(b[1:])), nil
}

// FenceOp returns the batch op that makes a write batch fail unless term is
// still the current term. It rewrites the term record with its own value.
func FenceOp(term int64) kv.Op {
	v := termValue(term)
	return kv.CompareAndSwap(coder.MetaKey(termName), v, v)
}

// IsFenced reports whether a commit error is the failure of FenceOp: another
// leader took over.
func IsFenced(err error) bool {
	c, ok := kv.AsConflict(err)
	return ok && bytes.Equal(c.Key, coder.MetaKey(termName))
}

// Options configure an Elector.
type Options struct {
	Store kv.Store
	// ID identifies this node; it must be unique among the nodes sharing
	// the store and stable across its restarts.
	ID string
	// URL is this node's advertised client URL.
	URL string
	// LeaseDuration is how long a leader stays leader without renewing,
	// and how long a candidate waits on an unchanged record.
	LeaseDuration time.Duration
	// RenewInterval is the period of renewals and of candidates' checks.
	RenewInterval time.Duration
	Logger        *slog.Logger
}

// Callbacks tell the server about role changes. They are called from the
// elector's loop, one at a time, in order.
type Callbacks struct {
	// Elected is called when this node becomes leader at term. The server
	// must fence its writes with Fence. ctx ends when the leadership ends.
	// An error (the leader state could not be recovered) steps down again;
	// the next round retries.
	Elected func(ctx context.Context, term int64) error
	// SteppedDown is called when this node stops leading. The server must
	// stop writing before it returns.
	SteppedDown func()
	// LeaderChanged is called whenever the known leader changes; ok is
	// false while there is none.
	LeaderChanged func(r Record, ok bool)
}

// Elector runs the election for one node.
type Elector struct {
	opts Options
	log  *slog.Logger

	mu        sync.Mutex
	leader    Record
	known     bool
	leading   bool
	term      int64
	renewedAt time.Time
}

// ErrNotLeader is returned by Fence when this node does not hold a valid
// lease.
var ErrNotLeader = errors.New("election: not the leader")

// Fence returns the op to add to a write batch, or ErrNotLeader when this
// node is not leader or its lease may have run out. Checking the lease here,
// right before each commit, keeps a leader whose elector is stuck on a slow
// store from writing past its lease.
func (e *Elector) Fence() (kv.Op, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leading || time.Since(e.renewedAt) >= e.opts.LeaseDuration {
		return kv.Op{}, ErrNotLeader
	}
	return FenceOp(e.term), nil
}

// New returns an Elector; Run starts it.
func New(opts Options) (*Elector, error) {
	if opts.Store == nil || opts.ID == "" {
		return nil, errors.New("election: store and ID are required")
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = 5 * time.Second
	}
	if opts.RenewInterval <= 0 {
		opts.RenewInterval = opts.LeaseDuration / 4
	}
	if opts.RenewInterval*2 > opts.LeaseDuration {
		return nil, fmt.Errorf("election: renew interval %v must be at most half the lease duration %v", opts.RenewInterval, opts.LeaseDuration)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Elector{opts: opts, log: opts.Logger}, nil
}

// Leader returns the leader this node knows of.
func (e *Elector) Leader() (Record, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leader, e.known
}

// IsLeader reports whether this node leads.
func (e *Elector) IsLeader() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leading
}

// Run takes part in the election until ctx ends; a leader steps down then.
func (e *Elector) Run(ctx context.Context, cb Callbacks) {
	var (
		raw         []byte    // lease record as last read
		observedAt  time.Time // when raw was first seen (candidates)
		renewedAt   time.Time // start of the last successful renewal (leader)
		leaderCtx   context.Context
		stopLeading context.CancelFunc
	)
	stepDown := func(why string) {
		if stopLeading == nil {
			return
		}
		e.log.Warn("stepping down", "reason", why)
		stopLeading()
		stopLeading = nil
		e.mu.Lock()
		e.leading = false
		e.mu.Unlock()
		if cb.SteppedDown != nil {
			cb.SteppedDown()
		}
	}
	setLeader := func(r Record, ok bool) {
		e.mu.Lock()
		changed := ok != e.known || r.Holder != e.leader.Holder || r.Term != e.leader.Term
		e.leader, e.known = r, ok
		e.mu.Unlock()
		if changed && cb.LeaderChanged != nil {
			cb.LeaderChanged(r, ok)
		}
	}
	defer stepDown("shutting down")
	t := time.NewTicker(e.opts.RenewInterval)
	defer t.Stop()
	for {
		start := time.Now()
		cur, err := e.opts.Store.Get(ctx, coder.MetaKey(leaseName))
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, kv.ErrNotFound):
			cur = nil
		case err != nil:
			e.log.Warn("election: reading the lease record failed", "err", err)
			if stopLeading != nil && time.Since(renewedAt) >= e.opts.LeaseDuration {
				stepDown("could not renew within the lease duration")
				setLeader(Record{}, false)
			}
			if stopLeading == nil && !observedAt.IsZero() && time.Since(observedAt) >= e.opts.LeaseDuration {
				// The leader we knew has not been seen renewing for a
				// whole lease: it may be gone.
				setLeader(Record{}, false)
			}
			goto wait
		}
		{
			var rec Record
			if cur != nil {
				if rec, err = decodeRecord(cur); err != nil {
					e.log.Error("election: lease record is malformed; taking over", "err", err)
					cur, rec = nil, Record{}
				}
			}
			switch {
			case cur != nil && rec.Holder == e.opts.ID && stopLeading != nil:
				// Leading: renew.
				next := rec
				next.Renewals++
				err := e.opts.Store.Commit(ctx, []kv.Op{kv.CompareAndSwap(coder.MetaKey(leaseName), cur, next.encode()), FenceOp(rec.Term)})
				switch {
				case err == nil:
					renewedAt = start
					raw = next.encode()
					e.mu.Lock()
					e.renewedAt = start
					e.mu.Unlock()
				case ctx.Err() != nil:
					return
				default:
					if _, lost := kv.AsConflict(err); lost {
						stepDown("another node took over")
						raw, observedAt = nil, time.Time{}
					} else if time.Since(renewedAt) >= e.opts.LeaseDuration {
						stepDown(fmt.Sprintf("could not renew within the lease duration: %v", err))
						setLeader(Record{}, false)
					}
				}
			case cur == nil || rec.Holder == e.opts.ID ||
				bytes.Equal(cur, raw) && !observedAt.IsZero() && time.Since(observedAt) >= e.opts.LeaseDuration:
				// No leader, our own previous incarnation, or a leader that
				// stopped renewing: take over.
				stepDown("lease record changed")
				term, ok := e.takeOver(ctx, cur, rec)
				if !ok && cur != nil && rec.Holder != e.opts.ID {
					// The holder stopped renewing and we could not take
					// over: there is no leader now.
					setLeader(Record{}, false)
				}
				if ok {
					renewedAt = start
					raw, observedAt = nil, time.Time{}
					var lctx context.Context
					lctx, stopLeading = context.WithCancel(ctx)
					leaderCtx = lctx
					e.mu.Lock()
					e.leading, e.term, e.renewedAt = true, term, start
					e.mu.Unlock()
					me := Record{Holder: e.opts.ID, URL: e.opts.URL, Term: term}
					setLeader(me, true)
					e.log.Info("elected leader", "term", term)
					if cb.Elected != nil {
						if err := cb.Elected(leaderCtx, term); err != nil {
							stepDown(fmt.Sprintf("taking up leadership failed: %v", err))
							setLeader(Record{}, false)
						}
					}
				}
			default:
				// Following: note when the record last changed.
				if !bytes.Equal(cur, raw) {
					raw, observedAt = cur, time.Now()
					setLeader(rec, true)
				}
				if stopLeading != nil {
					stepDown("another node holds the lease")
				}
			}
		}
		if stopLeading != nil && time.Since(renewedAt) >= e.opts.LeaseDuration {
			stepDown("lease expired before renewal")
			setLeader(Record{}, false)
		}
	wait:
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// takeOver writes a new lease record and term in one batch, conditional on
// the record read (or its absence).
func (e *Elector) takeOver(ctx context.Context, cur []byte, old Record) (int64, bool) {
	termKey := coder.MetaKey(termName)
	lastTerm := old.Term
	tv, err := e.opts.Store.Get(ctx, termKey)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		tv = nil
	case err != nil:
		e.log.Warn("election: reading the term failed", "err", err)
		return 0, false
	default:
		if t, derr := decodeTerm(tv); derr == nil {
			lastTerm = max(lastTerm, t)
		}
	}
	term := lastTerm + 1
	rec := Record{Holder: e.opts.ID, URL: e.opts.URL, Term: term}
	ops := make([]kv.Op, 0, 2)
	if cur == nil {
		ops = append(ops, kv.PutIfAbsent(coder.MetaKey(leaseName), rec.encode()))
	} else {
		ops = append(ops, kv.CompareAndSwap(coder.MetaKey(leaseName), cur, rec.encode()))
	}
	if tv == nil {
		ops = append(ops, kv.PutIfAbsent(termKey, termValue(term)))
	} else {
		ops = append(ops, kv.CompareAndSwap(termKey, tv, termValue(term)))
	}
	if err := e.opts.Store.Commit(ctx, ops); err != nil {
		if _, lost := kv.AsConflict(err); !lost {
			e.log.Warn("election: taking over failed", "err", err)
		}
		return 0, false
	}
	return term, true
}
