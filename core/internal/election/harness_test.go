package election

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/engramkv/engram/core/internal/clock/fakeclock"
	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
	"github.com/engramkv/engram/engines/memkv"
)

const (
	testLease = 4 * time.Second
	testRenew = time.Second
)

// t0 is where every test's fake time starts.
var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// cluster is a set of electors over one memkv store on one fake clock, each
// elector on a Loop view of it, so that Advance steps them one event at a
// time. After every event it checks the safety invariant.
type cluster struct {
	t      *testing.T
	clk    *fakeclock.Clock
	shared *memkv.Store
	nodes  []*node
	// leaders counts the checks that found a leader, for tests that want
	// the check to have seen something.
	leaders int
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, clk: fakeclock.New(t, t0), shared: memkv.New()}
	c.clk.SetCheck(c.checkInvariant)
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.stop()
		}
	})
	return c
}

// node is one elector and what its callbacks reported.
type node struct {
	c     *cluster
	id    string
	e     *Elector
	clock *fakeclock.Loop
	lease time.Duration // 0: testLease
	// candidate is the elector's Options.Candidate; nil: always.
	candidate func(context.Context) bool

	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	events    []string
	leaderCtx context.Context
	// electErrs are returned by the next calls of Elected, one each.
	electErrs []error
}

// start runs an elector over store (the shared store, or a wrapper around
// it) and waits for its first round to end.
func (c *cluster) start(id string, store kv.Store) *node {
	c.t.Helper()
	return c.startWith(id, store, nil)
}

// startWith is start with prepare run on the node before its Run starts.
func (c *cluster) startWith(id string, store kv.Store, prepare func(*node)) *node {
	c.t.Helper()
	n := &node{c: c, id: id, clock: c.clk.Loop(), done: make(chan struct{})}
	if prepare != nil {
		prepare(n)
	}
	lease := testLease
	if n.lease > 0 {
		lease = n.lease
	}
	e, err := New(Options{
		Store:         store,
		ID:            id,
		URL:           "http://" + id,
		LeaseDuration: lease,
		RenewInterval: testRenew,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		Clock:         n.clock,
		Candidate:     n.candidate,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	// A hand-off's wake-up is stepped on the fake clock like a tick.
	e.wakeLoop = func() { n.clock.Wake(e.signalWake) }
	n.e = e
	c.nodes = append(c.nodes, n)
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() {
		defer close(n.done)
		e.Run(ctx, Callbacks{
			Elected: func(ctx context.Context, term int64) error {
				n.mu.Lock()
				defer n.mu.Unlock()
				n.events = append(n.events, fmt.Sprintf("elected %d", term))
				n.leaderCtx = ctx
				if len(n.electErrs) > 0 {
					err := n.electErrs[0]
					n.electErrs = n.electErrs[1:]
					return err
				}
				return nil
			},
			SteppedDown: func() { n.note("stepped down") },
			LeaderChanged: func(r Record, ok bool) {
				if !ok {
					n.note("leader none")
					return
				}
				n.note(fmt.Sprintf("leader %s %d", r.Holder, r.Term))
			},
		})
	}()
	n.clock.WaitIdle()
	c.checkInvariant()
	return n
}

func (n *node) note(ev string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.events = append(n.events, ev)
}

// takeEvents returns the callbacks reported since the last call.
func (n *node) takeEvents() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	ev := n.events
	n.events = nil
	return ev
}

// expect checks the callbacks reported since the last takeEvents.
func (n *node) expect(want ...string) {
	n.c.t.Helper()
	got := n.takeEvents()
	if !slices.Equal(got, want) {
		n.c.t.Fatalf("at %v, %s reported %q, want %q", n.c.elapsed(), n.id, got, want)
	}
}

// takeLeaderCtx returns the context the last Elected call got.
func (n *node) takeLeaderCtx() context.Context {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leaderCtx
}

// stop cancels the node's Run and waits for it to return.
func (n *node) stop() {
	n.cancel()
	select {
	case <-n.done:
	case <-time.After(fakeclock.Watchdog):
		n.c.t.Fatalf("%s: Run did not return", n.id)
	}
}

// fenceTerm returns the term of the node's fence, or 0 when Fence fails.
func (n *node) fenceTerm() int64 {
	op, err := n.e.Fence()
	if err != nil {
		if !errors.Is(err, ErrNotLeader) {
			n.c.t.Fatalf("%s: Fence: %v", n.id, err)
		}
		return 0
	}
	term, err := decodeTerm(op.Value)
	if err != nil {
		n.c.t.Fatalf("%s: fence op: %v", n.id, err)
	}
	return term
}

// expectLeading checks that the node leads with a valid lease at term.
func (n *node) expectLeading(term int64) {
	n.c.t.Helper()
	if !n.e.IsLeader() || n.fenceTerm() != term {
		n.c.t.Fatalf("at %v, %s: leader %v, fence term %d; want leader at term %d", n.c.elapsed(), n.id, n.e.IsLeader(), n.fenceTerm(), term)
	}
}

// expectFollowing checks that the node neither leads nor can fence.
func (n *node) expectFollowing() {
	n.c.t.Helper()
	if n.e.IsLeader() || n.fenceTerm() != 0 {
		n.c.t.Fatalf("at %v, %s: leader %v, fence term %d; want a follower", n.c.elapsed(), n.id, n.e.IsLeader(), n.fenceTerm())
	}
}

// at is the fake time d after the start.
func at(d time.Duration) time.Time { return t0.Add(d) }

func (c *cluster) elapsed() time.Duration { return c.clk.Now().Sub(t0) }

// record returns the stored lease record (ok false when absent) and term.
func (c *cluster) record() (Record, int64, bool) {
	c.t.Helper()
	ctx := context.Background()
	raw, err := c.shared.Get(ctx, coder.MetaKey(leaseName))
	if errors.Is(err, kv.ErrNotFound) {
		return Record{}, 0, false
	}
	if err != nil {
		c.t.Fatal(err)
	}
	rec, err := decodeRecord(raw)
	if err != nil {
		c.t.Fatalf("stored lease record: %v", err)
	}
	tv, err := c.shared.Get(ctx, coder.MetaKey(termName))
	if err != nil {
		c.t.Fatalf("stored term: %v", err)
	}
	term, err := decodeTerm(tv)
	if err != nil {
		c.t.Fatal(err)
	}
	return rec, term, true
}

// expectRecord checks the stored lease record's holder, term and renewals
// (renewals < 0: any), and that the term record agrees.
func (c *cluster) expectRecord(holder string, term int64, renewals int) {
	c.t.Helper()
	rec, stored, ok := c.record()
	if !ok || rec.Holder != holder || rec.Term != term || stored != term || renewals >= 0 && rec.Renewals != uint64(renewals) {
		c.t.Fatalf("at %v: record %+v (present %v), term record %d; want holder %s term %d renewals %d", c.elapsed(), rec, ok, stored, holder, term, renewals)
	}
}

// checkInvariant: at no point of the fake time do two electors both lead
// with a fence that succeeds, and an elector that does is the holder of the
// stored lease record at the term of its fence, which the term record holds.
func (c *cluster) checkInvariant() {
	c.t.Helper()
	var leaders []string
	for _, n := range c.nodes {
		if !n.e.IsLeader() {
			continue
		}
		term := n.fenceTerm()
		if term == 0 {
			continue // leading on paper, but its lease ended: it cannot write
		}
		leaders = append(leaders, fmt.Sprintf("%s@%d", n.id, term))
		rec, stored, ok := c.record()
		if !ok || rec.Holder != n.id || rec.Term != term || stored != term {
			c.t.Errorf("at %v, %s leads at term %d, but the store holds %+v (present %v), term %d", c.elapsed(), n.id, term, rec, ok, stored)
		}
	}
	if len(leaders) > 1 {
		c.t.Errorf("at %v, two leaders: %s", c.elapsed(), strings.Join(leaders, ", "))
	}
	if len(leaders) > 0 {
		c.leaders++
	}
}

// fencedCommit commits a write fenced with term to the shared store.
func (c *cluster) fencedCommit(term int64) error {
	return c.shared.Commit(context.Background(), []kv.Op{kv.Put([]byte("data"), []byte("x")), FenceOp(term)})
}

var errUncertain = fmt.Errorf("injected timeout after sending: %w", kv.ErrUncertain)

// heldStore holds the next Commit or Get it is told to until the caller's
// context ends, parking the elector's loop on its fake clock; released
// receives the held call's context error when it ends.
type heldStore struct {
	kv.Store

	mu         sync.Mutex
	clock      *fakeclock.Loop
	holdCommit bool
	holdGet    bool
	released   chan error
}

func newHeldStore(s kv.Store) *heldStore {
	return &heldStore{Store: s, released: make(chan error, 1)}
}

// holdNext holds the next Commit (commit true) or Get of the loop that
// clock belongs to.
func (s *heldStore) holdNext(clock *fakeclock.Loop, commit bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clock = clock
	if commit {
		s.holdCommit = true
	} else {
		s.holdGet = true
	}
}

func (s *heldStore) hold(ctx context.Context) error {
	s.mu.Lock()
	clock := s.clock
	s.mu.Unlock()
	clock.Park()
	<-ctx.Done()
	s.released <- ctx.Err()
	return fmt.Errorf("held: %w", ctx.Err())
}

func (s *heldStore) Commit(ctx context.Context, ops []kv.Op) error {
	s.mu.Lock()
	h := s.holdCommit
	s.holdCommit = false
	s.mu.Unlock()
	if h {
		return s.hold(ctx)
	}
	return s.Store.Commit(ctx, ops)
}

func (s *heldStore) Get(ctx context.Context, key []byte) ([]byte, error) {
	s.mu.Lock()
	h := s.holdGet
	s.holdGet = false
	s.mu.Unlock()
	if h {
		return nil, s.hold(ctx)
	}
	return s.Store.Get(ctx, key)
}

// hookStore runs before, once, ahead of the next Commit.
type hookStore struct {
	kv.Store
	mu     sync.Mutex
	before func()
}

func (s *hookStore) Commit(ctx context.Context, ops []kv.Op) error {
	s.mu.Lock()
	f := s.before
	s.before = nil
	s.mu.Unlock()
	if f != nil {
		f()
	}
	return s.Store.Commit(ctx, ops)
}

// faultSwitch sends calls through a fault-injecting store until the faults
// are switched off, then straight to the clean store (dropping the faults
// still queued).
type faultSwitch struct {
	*kvfault.Store
	clean kv.Store
	off   atomic.Bool
}

func (s *faultSwitch) store() kv.Store {
	if s.off.Load() {
		return s.clean
	}
	return s.Store
}

func (s *faultSwitch) Get(ctx context.Context, key []byte) ([]byte, error) {
	return s.store().Get(ctx, key)
}

func (s *faultSwitch) Commit(ctx context.Context, ops []kv.Op) error {
	return s.store().Commit(ctx, ops)
}

// slowStore makes every call take d on the fake clock, and fails every call
// once failing is set.
type slowStore struct {
	kv.Store
	clk     *fakeclock.Clock
	d       time.Duration
	failing atomic.Bool
}

func (s *slowStore) Get(ctx context.Context, key []byte) ([]byte, error) {
	if s.failing.Load() {
		return nil, errors.New("store down")
	}
	s.clk.Pass(s.d)
	return s.Store.Get(ctx, key)
}

func (s *slowStore) Commit(ctx context.Context, ops []kv.Op) error {
	if s.failing.Load() {
		return errors.New("store down")
	}
	s.clk.Pass(s.d)
	return s.Store.Commit(ctx, ops)
}
