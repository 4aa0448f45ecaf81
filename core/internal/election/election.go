// Package election elects one leader among Engram nodes that share a store,
// using only the kv.Store contract, and fences a deposed leader's writes.
//
// It owns two records in the store: the lease record (who leads, at which
// term, and a renewal counter the leader bumps every RenewInterval with a
// compare-and-swap) and the term record (the current term, rewritten only
// when leadership changes). It must not decide what a leader does (the
// server reacts to its callbacks), write any other key, or read the time
// other than through its Clock. It must never count itself leader on
// anything but its own committed takeover: an uncertain commit answer is a
// failure even when the record was written, and the next round claims the
// record again with a new term.
//
// # Safety
//
// Invariant: at no time do two nodes both count themselves leader with a
// lease that has not ended (Fence succeeds on both), and, whatever the
// clocks do, no write batch fenced with a term commits once a later term has
// begun. No clock is shared between nodes; each node only measures durations
// on its own clock, and the first half needs those clocks to run at the same
// rate, nothing more. Three rules make it hold:
//
//   - A leader stops serving (Fence fails) no later than LeaseDuration after
//     the start of its last successful renewal (or of its takeover), even
//     when it cannot reach the store. Its loop steps down at that moment too,
//     also when a store call hangs (the call is abandoned); only a callback
//     still running (a slow Elected) delays the step-down, never the end of
//     Fence.
//   - A candidate takes over only after it has seen the same lease record,
//     unchanged, for LeaseDuration from when it first saw it. It first saw
//     the record after the renewal that wrote it committed, and that renewal
//     started before it committed, so the old leader's lease has ended by
//     then. Records never repeat (terms only grow, and renewals only grow
//     within a term), so a record that changed and changed back cannot fool
//     the wait.
//   - Every write batch of a leader carries FenceOp, a compare of the term
//     record against its own term. Taking over rewrites the term record in
//     the same batch as the lease record, so once a new leader exists every
//     batch of an old one fails whole, even a leader that missed its lease
//     end (a stalled process, a clock that ran slow).
//
// # Hand-off
//
// Handoff (etcd's MoveLeader) gives leadership to a named node at once
// instead of at a lease end. The leader first stops serving: from the call
// on, Fence fails, so no new write batch of its term starts. The call wakes
// its loop for a renewal round at once (writes wait for none of it, so
// waiting for the next tick would only lengthen the gap). In that round the
// loop steps down (the server's SteppedDown stops the leader state; batches
// already carrying FenceOp fail once a later term begins) and, instead of
// renewing, writes the record again with Handoff set to the target,
// conditional on the record it read and fenced with its term.
// The target claims a record handed to it at its next round, without the
// usual wait, with a new term through the same takeover batch as any claim;
// the caller of Handoff wakes the target for that round at once (Wake), and
// the new leader wakes the others, so leadership changes hands in a few
// store round trips instead of renew intervals.
// That keeps the invariant: when the target's lease starts, the old leader's
// Fence has already failed since before the hand-off record was written, and
// the new term fails every batch of the old one. Other nodes treat the
// hand-off record as any changed record (no leader known, claim after it
// stays unchanged for LeaseDuration), so a target that never claims (it died)
// leaves the cluster leaderless for at most one lease: the old leader, which
// knows it no longer serves, claims it again (a new term) at its first round
// at least LeaseDuration - RenewInterval after writing it. Claiming early is
// safe for it, because the wait only protects a holder that may still serve,
// and it is that holder. A restarted node does not take over at once a
// record naming it with a hand-off (the rule below): it waits like the others.
//
// # Learners and moved URLs
//
// A node whose Options.Candidate says no (an etcd learner) runs the same
// rounds but never claims: where a candidate would claim, it reports no
// leader and keeps following the record, so it follows a new leader at
// once. Candidate is asked only then, so the server may read the store in
// it (a learner promoted meanwhile claims at that round). A node never
// counts itself leader without its own takeover, so the invariant does
// not depend on Candidate. SetURL changes the URL the node's next takeover
// or renewal writes; a follower counts a record whose URL changed as a
// change of leader, so it forwards to the new URL.
//
// A node that starts with the same ID as the recorded holder (the same
// process name on the same store) takes over at once with a new term: the
// previous holder was itself. IDs must therefore be unique among live nodes.
//
// Run is a small state machine (follow, claim, renew, wait; see run.go): one
// round at start and then one every RenewInterval, each a read of the lease
// record and at most one conditional batch. What the server does with the
// roles: (DESIGN.md, "Cluster roles and forwarding").
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

	"github.com/engramkv/engram/core/internal/clock"
	"github.com/engramkv/engram/core/internal/coder"
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
	// Handoff names the node the holder handed leadership to; empty while
	// the holder leads (see "Hand-off" in the package doc).
	Handoff string
}

func (r Record) encode() []byte {
	b := []byte{format}
	b = binary.AppendUvarint(b, uint64(r.Term))
	b = binary.AppendUvarint(b, r.Renewals)
	b = binary.AppendUvarint(b, uint64(len(r.Holder)))
	b = append(b, r.Holder...)
	b = binary.AppendUvarint(b, uint64(len(r.URL)))
	b = append(b, r.URL...)
	if r.Handoff != "" {
		// A trailing field: a record without it reads as before.
		b = binary.AppendUvarint(b, uint64(len(r.Handoff)))
		b = append(b, r.Handoff...)
	}
	return b
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
	if r.URL, b, err = readString(b); err != nil {
		return r, err
	}
	if len(b) > 0 {
		if r.Handoff, _, err = readString(b); err != nil {
			return r, err
		}
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
	// URL is where the other nodes reach this node (its peer URL) and so
	// where followers forward while it leads; SetURL changes it.
	URL string
	// Candidate, if set, is asked before each claim whether this node may
	// lead; false makes it a follower that never campaigns (an etcd
	// learner), whatever the record says. nil: always a candidate. It is
	// called only when the node would claim, so it may read the store.
	Candidate func(ctx context.Context) bool
	// LeaseDuration is how long a leader stays leader without renewing,
	// and how long a candidate waits on an unchanged record.
	LeaseDuration time.Duration
	// RenewInterval is the period of renewals and of candidates' checks.
	RenewInterval time.Duration
	Logger        *slog.Logger
	// Clock is the time source; nil means the system clock. Tests inject
	// a fake one (package fakeclock). The loop has one ticker and calls its
	// C only when it starts waiting for the next round, as clock.Ticker
	// asks.
	Clock clock.Clock
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
	// stop writing before it returns. It comes before the LeaderChanged
	// that names the next leader (or none).
	SteppedDown func()
	// LeaderChanged is called whenever the known leader changes; ok is
	// false while there is none. While Run runs, the known leader is this
	// node only while it leads.
	LeaderChanged func(r Record, ok bool)
}

// Elector runs the election for one node.
type Elector struct {
	opts  Options
	log   *slog.Logger
	clock clock.Clock

	// mu guards what the loop publishes for Fence, Leader and IsLeader.
	mu        sync.Mutex
	leader    Record
	known     bool
	leading   bool
	term      int64
	renewedAt time.Time
	// handoff is a hand-off asked for and not yet written; Fence fails
	// while it is set.
	handoff *handoffReq
	// changed is closed and replaced whenever the known leader changes.
	changed chan struct{}
	// url is this node's peer URL now (Options.URL, then SetURL).
	url string

	// wake ends the loop's wait early (a hand-off asked for); wakeLoop
	// sends on it. (The election's tests wrap wakeLoop so that their fake
	// clock steps the round it starts like a tick's.)
	wake     chan struct{}
	wakeLoop func()
}

// ErrNotLeader is returned by Fence when this node does not hold a valid
// lease.
var ErrNotLeader = errors.New("election: not the leader")

// Fence returns the op to add to a write batch, or ErrNotLeader when this
// node is not leader or its lease may have run out (on the elector's Clock).
// Checking the lease here, right before each commit, keeps a leader whose
// elector is stuck on a slow store or in a callback from serving past its
// lease. The check holds at the moment of the call only: a write stays safe
// after it through FenceOp; a read must take its read point after the call.
func (e *Elector) Fence() (kv.Op, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leading || e.handoff != nil || e.clock.Now().Sub(e.renewedAt) >= e.opts.LeaseDuration {
		return kv.Op{}, ErrNotLeader
	}
	return FenceOp(e.term), nil
}

// DefaultLeaseDuration is Options.LeaseDuration when it is not set.
const DefaultLeaseDuration = 5 * time.Second

// New returns an Elector; Run starts it.
func New(opts Options) (*Elector, error) {
	if opts.Store == nil || opts.ID == "" {
		return nil, errors.New("election: store and ID are required")
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = DefaultLeaseDuration
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
	if opts.Clock == nil {
		opts.Clock = clock.Real
	}
	e := &Elector{opts: opts, log: opts.Logger, clock: opts.Clock, changed: make(chan struct{}), wake: make(chan struct{}, 1), url: opts.URL}
	e.wakeLoop = e.signalWake
	return e, nil
}

// SetURL changes the URL this node's records name: its next takeover or
// renewal writes it, so followers forward there from then on.
func (e *Elector) SetURL(url string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.url = url
}

// currentURL is the URL the next record this node writes names.
func (e *Elector) currentURL() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.url
}

// candidate reports whether this node may claim now.
func (e *Elector) candidate(ctx context.Context) bool {
	return e.opts.Candidate == nil || e.opts.Candidate(ctx)
}

// Leader returns the leader this node knows of.
func (e *Elector) Leader() (Record, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leader, e.known
}

// IsLeader reports whether this node leads. It turns false when the loop
// steps down; Fence already fails from the end of the lease on, even while
// a callback holds the loop.
func (e *Elector) IsLeader() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leading
}

// takeOver writes a new lease record and term in one batch, conditional on
// the lease record read (cur, nil when absent; old is its content, zero when
// malformed) and on the term record. It returns the new term, or an error
// when the batch was not applied or may not have been (kv.ErrUncertain): the
// caller does not lead then, whatever the record says.
func (e *Elector) takeOver(ctx context.Context, cur []byte, old Record) (int64, error) {
	termKey := coder.MetaKey(termName)
	lastTerm := old.Term
	tv, err := e.opts.Store.Get(ctx, termKey)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		tv = nil
	case err != nil:
		return 0, fmt.Errorf("reading the term: %w", err)
	default:
		if t, derr := decodeTerm(tv); derr == nil {
			lastTerm = max(lastTerm, t)
		}
	}
	term := lastTerm + 1
	rec := Record{Holder: e.opts.ID, URL: e.currentURL(), Term: term}
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
		return 0, err
	}
	return term, nil
}
