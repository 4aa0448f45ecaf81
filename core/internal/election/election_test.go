package election

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
)

// The tests run electors on a fake timeline (see timeline): time moves only
// when a test advances it, and each tick wakes one loop at a time, so every
// schedule below is exact. Leases are 4 s and rounds 1 s; electors started
// together tick together, the first started first.

func TestLoneNodeTakesOverAndRenews(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", c.shared)
	// The first round runs at once: the store is empty, a takes over.
	a.expect("leader a 1", "elected 1")
	a.expectLeading(1)
	c.expectRecord("a", 1, 0)

	// It renews every round, so it leads on past many leases.
	c.tl.advanceTo(at(10 * time.Second))
	c.expectRecord("a", 1, 10)
	a.expectLeading(1)
	a.expect()

	// A second elector follows and reports the leader.
	b := c.start("b", c.shared)
	b.expect("leader a 1")
	b.expectFollowing()
	if r, ok := b.e.Leader(); !ok || r.Holder != "a" || r.URL != "http://a" || r.Term != 1 {
		t.Fatalf("b's leader: %+v %v", r, ok)
	}
	c.tl.advance(5 * testLease)
	a.expect()
	b.expect()
	a.expectLeading(1)
	b.expectFollowing()
	c.expectRecord("a", 1, 30)
}

// TestTakeoverAfterLeaderStops: the follower takes over only after it has
// seen the same record for a whole lease, with the next term; the old
// leader's fence fails from its lease end on, and its fence op conflicts
// once the new leader took over.
func TestTakeoverAfterLeaderStops(t *testing.T) {
	for _, how := range []string{"store unreachable", "Run stopped"} {
		t.Run(how, func(t *testing.T) {
			c := newCluster(t)
			fa := kvfault.Wrap(c.shared)
			a := c.start("a", fa)
			b := c.start("b", c.shared)
			a.expect("leader a 1", "elected 1")
			b.expect("leader a 1")

			// a renews last at 5 s (b sees that record at 5 s, after a's
			// round); then it stops.
			c.tl.advanceTo(at(5 * time.Second))
			c.expectRecord("a", 1, 5)
			if how == "Run stopped" {
				a.stop()
				a.expect("stepped down")
				a.expectFollowing()
			} else {
				fa.Partition(errors.New("partitioned"))
			}

			c.tl.advanceTo(at(9*time.Second - time.Nanosecond))
			b.expectFollowing()
			b.expect()
			if how == "store unreachable" {
				a.expectLeading(1) // its lease runs to 9 s
				a.expect()
			}
			if err := c.fencedCommit(1); err != nil {
				t.Fatalf("term 1 write before the takeover: %v", err)
			}

			// At 9 s a's lease ends and b has seen the record unchanged for
			// a lease: a steps down, then b takes over.
			c.tl.advanceTo(at(9 * time.Second))
			if how == "store unreachable" {
				a.expect("stepped down", "leader none")
				a.expectFollowing()
			}
			b.expect("leader b 2", "elected 2")
			b.expectLeading(2)
			c.expectRecord("b", 2, 0)
			if err := c.fencedCommit(1); !IsFenced(err) {
				t.Fatalf("term 1 write after the takeover: %v, want fenced", err)
			}
			if err := c.fencedCommit(2); err != nil {
				t.Fatalf("term 2 write: %v", err)
			}

			if how == "store unreachable" {
				fa.Heal()
				c.tl.advance(testRenew)
				a.expect("leader b 2")
				a.expectFollowing()
			}
			c.tl.advance(3 * testLease)
			b.expectLeading(2)
			c.expectRecord("b", 2, int((c.elapsed()-9*time.Second)/testRenew))
		})
	}
}

// TestStuckRenewal: a renewal (its commit or its read) that hangs makes the
// leader step down exactly when its lease ends, and the hung call is
// cancelled.
func TestStuckRenewal(t *testing.T) {
	for _, call := range []string{"Commit", "Get"} {
		t.Run(call, func(t *testing.T) {
			c := newCluster(t)
			ha := newHeldStore(c.shared)
			a := c.start("a", ha)
			b := c.start("b", c.shared)
			a.expect("leader a 1", "elected 1")
			b.expect("leader a 1")
			c.tl.advanceTo(at(5 * time.Second))

			// At 6 s a's round hangs in the store.
			ha.holdNext(a.clock, call == "Commit")
			c.tl.advanceTo(at(6 * time.Second))
			c.tl.advanceTo(at(9*time.Second - time.Nanosecond))
			a.expectLeading(1)
			a.expect()
			select {
			case err := <-ha.released:
				t.Fatalf("held call ended early: %v", err)
			default:
			}

			// Its lease (from 5 s) ends at 9 s: b takes over (its tick
			// comes first) and a, held, steps down at the same instant.
			c.tl.advanceTo(at(9 * time.Second))
			a.expect("stepped down", "leader none")
			a.expectFollowing()
			b.expect("leader b 2", "elected 2")
			b.expectLeading(2)
			select {
			case err := <-ha.released:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("held call ended with %v", err)
				}
			case <-time.After(watchdog):
				t.Fatal("held call was not cancelled")
			}
			c.expectRecord("b", 2, 0)

			c.tl.advance(testRenew)
			a.expect("leader b 2")
			a.expectFollowing()
		})
	}
}

// TestStuckRenewalAlone: without a candidate to take over, a hung renewal
// still steps the leader down at its lease end, and it leads again with the
// next term once the store answers.
func TestStuckRenewalAlone(t *testing.T) {
	c := newCluster(t)
	ha := newHeldStore(c.shared)
	a := c.start("a", ha)
	a.expect("leader a 1", "elected 1")
	c.tl.advanceTo(at(2 * time.Second))
	ha.holdNext(a.clock, true)
	c.tl.advanceTo(at(6*time.Second - time.Nanosecond))
	a.expectLeading(1)
	c.tl.advance(time.Nanosecond)
	a.expect("stepped down", "leader none")
	a.expectFollowing()
	<-ha.released
	// The record still names a: the next round claims it at once.
	c.tl.advanceTo(at(7 * time.Second))
	a.expect("leader a 2", "elected 2")
	a.expectLeading(2)
	c.expectRecord("a", 2, 0)
}

// TestLeaseRunsFromRoundStart: the lease of a renewal (and of a takeover)
// counts from the start of its round, before the record was read, not from
// when the store answered: the candidate's wait only covers time after the
// commit.
func TestLeaseRunsFromRoundStart(t *testing.T) {
	c := newCluster(t)
	sa := &slowStore{Store: c.shared, tl: c.tl, d: 300 * time.Millisecond}
	a := c.start("a", sa)
	// Claimed in the round that began at 0 and ended at 0.9 s.
	a.expect("leader a 1", "elected 1")
	sa.failing.Store(true)
	c.tl.advanceTo(at(4*time.Second - time.Nanosecond))
	a.expectLeading(1)
	c.tl.advanceTo(at(4 * time.Second))
	a.expect("stepped down", "leader none")
	a.expectFollowing()

	sa.failing.Store(false)
	c.tl.advanceTo(at(5 * time.Second)) // claims again: the round starts at 5 s
	a.expect("leader a 2", "elected 2")
	c.tl.advanceTo(at(6 * time.Second)) // renewed in the round from 6 s to 6.6 s
	c.expectRecord("a", 2, 1)
	sa.failing.Store(true)
	c.tl.advanceTo(at(10*time.Second - time.Nanosecond))
	a.expectLeading(2)
	c.tl.advanceTo(at(10 * time.Second))
	a.expect("stepped down", "leader none")
	a.expectFollowing()
}

// TestStepDownBetweenRounds: a leader whose renewals fail steps down at its
// lease end, also when that falls between two rounds.
func TestStepDownBetweenRounds(t *testing.T) {
	c := newCluster(t)
	fa := kvfault.Wrap(c.shared)
	a := c.startWith("a", fa, func(n *node) { n.lease = 3500 * time.Millisecond })
	a.expect("leader a 1", "elected 1")
	c.tl.advanceTo(at(2 * time.Second))
	fa.Partition(errors.New("partitioned"))
	c.tl.advanceTo(at(5500*time.Millisecond - time.Nanosecond))
	a.expectLeading(1)
	a.expect()
	c.tl.advanceTo(at(5500 * time.Millisecond))
	a.expect("stepped down", "leader none")
	a.expectFollowing()
}

// TestLostRenewal: when another writer changed the lease record or the term
// between the leader's read and its renewal, the renewal's compare-and-swap
// fails and the leader steps down at once, well within its lease.
func TestLostRenewal(t *testing.T) {
	ctx := context.Background()
	usurp := func(c *cluster, lease bool) func() {
		return func() {
			ops := []kv.Op{kv.CompareAndSwap(coder.MetaKey(termName), termValue(1), termValue(2))}
			if lease {
				cur, err := c.shared.Get(ctx, coder.MetaKey(leaseName))
				if err != nil {
					t.Error(err)
					return
				}
				ops = append(ops, kv.CompareAndSwap(coder.MetaKey(leaseName), cur, Record{Holder: "x", URL: "http://x", Term: 2}.encode()))
			}
			if err := c.shared.Commit(ctx, ops); err != nil {
				t.Error(err)
			}
		}
	}

	t.Run("lease record", func(t *testing.T) {
		c := newCluster(t)
		ha := &hookStore{Store: c.shared}
		a := c.start("a", ha)
		b := c.start("b", c.shared)
		a.expect("leader a 1", "elected 1")
		b.expect("leader a 1")
		c.tl.advanceTo(at(3 * time.Second))
		ha.before = usurp(c, true)
		c.tl.advanceTo(at(4 * time.Second))
		a.expect("stepped down", "leader none")
		a.expectFollowing()
		b.expect("leader x 2")
		c.tl.advance(testRenew)
		a.expect("leader x 2")
	})

	t.Run("term record", func(t *testing.T) {
		c := newCluster(t)
		ha := &hookStore{Store: c.shared}
		a := c.start("a", ha)
		a.expect("leader a 1", "elected 1")
		c.tl.advanceTo(at(3 * time.Second))
		ha.before = usurp(c, false)
		c.tl.advanceTo(at(4 * time.Second))
		// The fence op of the renewal failed.
		a.expect("stepped down", "leader none")
		a.expectFollowing()
		// The lease record still names a, so it claims it again at once,
		// above the term it found.
		c.tl.advance(testRenew)
		a.expect("leader a 3", "elected 3")
		a.expectLeading(3)
		c.expectRecord("a", 3, 0)
	})
}

// TestUncertainRenewal: a renewal whose commit answer is uncertain does not
// extend the lease, whether or not it was applied; the next sure renewal
// does. With no sure renewal for a whole lease the leader steps down at its
// lease end, and only then may it claim the record again.
func TestUncertainRenewal(t *testing.T) {
	c := newCluster(t)
	fa := kvfault.Wrap(c.shared)
	a := c.start("a", fa)
	b := c.start("b", c.shared)
	a.expect("leader a 1", "elected 1")
	b.expect("leader a 1")
	c.tl.advanceTo(at(3 * time.Second))

	fa.FailCommits(kvfault.Fault{Err: errUncertain}, kvfault.Fault{Err: errUncertain, Apply: true})
	c.tl.advanceTo(at(4 * time.Second)) // not applied
	c.expectRecord("a", 1, 3)
	c.tl.advanceTo(at(5 * time.Second)) // applied: a does not know
	c.expectRecord("a", 1, 4)
	a.expectLeading(1)
	c.tl.advanceTo(at(6 * time.Second)) // renewed
	c.expectRecord("a", 1, 5)
	c.tl.advanceTo(at(10*time.Second - time.Nanosecond))
	a.expectLeading(1) // from the renewal at 6 s, not the last one at 9 s
	a.expect()
	b.expect()

	// From 10 s on, every renewal answer is uncertain; the ones at 11 s and
	// 13 s were applied. The last sure renewal started at 10 s.
	c.tl.advanceTo(at(10 * time.Second))
	fa.FailCommits(
		kvfault.Fault{Err: errUncertain, Apply: true},
		kvfault.Fault{Err: errUncertain},
		kvfault.Fault{Err: errUncertain, Apply: true},
	)
	c.tl.advanceTo(at(14*time.Second - time.Nanosecond))
	a.expectLeading(1)
	c.expectRecord("a", 1, 11)
	c.tl.advanceTo(at(14 * time.Second))
	a.expect("stepped down", "leader none")
	a.expectFollowing()
	b.expect()
	b.expectFollowing()
	// The record still names a (b saw it change at 13 s and waits): a
	// claims it at once in its next round.
	c.tl.advanceTo(at(15 * time.Second))
	a.expect("leader a 2", "elected 2")
	a.expectLeading(2)
	b.expect("leader a 2")
	b.expectFollowing()
}

// TestUncertainTakeover: a takeover whose answer is uncertain does not make
// the candidate leader, even when it was applied; it claims again in the
// next round (with the next term if the record now names it).
func TestUncertainTakeover(t *testing.T) {
	for _, applied := range []bool{true, false} {
		t.Run(fmt.Sprintf("applied=%v", applied), func(t *testing.T) {
			c := newCluster(t)
			fa := kvfault.Wrap(c.shared)
			fb := kvfault.Wrap(c.shared)
			a := c.start("a", fa)
			b := c.start("b", fb)
			a.expect("leader a 1", "elected 1")
			b.expect("leader a 1")
			c.tl.advanceTo(at(5 * time.Second))
			fa.Partition(errors.New("partitioned"))
			fb.FailCommits(kvfault.Fault{Err: errUncertain, Apply: applied})

			c.tl.advanceTo(at(9 * time.Second))
			a.expect("stepped down", "leader none")
			b.expect("leader none")
			b.expectFollowing()
			if applied {
				c.expectRecord("b", 2, 0)
			} else {
				c.expectRecord("a", 1, 5)
			}

			c.tl.advanceTo(at(10 * time.Second))
			term := int64(2)
			if applied {
				term = 3
			}
			b.expect(fmt.Sprintf("leader b %d", term), fmt.Sprintf("elected %d", term))
			b.expectLeading(term)
			c.expectRecord("b", term, 0)
			if err := c.fencedCommit(1); !IsFenced(err) {
				t.Fatalf("term 1 write: %v, want fenced", err)
			}

			fa.Heal()
			c.tl.advance(testRenew)
			a.expect(fmt.Sprintf("leader b %d", term))
			a.expectFollowing()
		})
	}
}

// TestMalformedRecordIsTakenOver: a lease record that does not decode is no
// leader's: it is replaced at once, above the stored term if that decodes.
func TestMalformedRecordIsTakenOver(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		term []byte // nil: absent
		want int64
	}{
		{"term record", termValue(6), 7},
		{"malformed term record", []byte("junk"), 1},
		{"no term record", nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			ops := []kv.Op{kv.Put(coder.MetaKey(leaseName), []byte("\x01junk"))}
			if tc.term != nil {
				ops = append(ops, kv.Put(coder.MetaKey(termName), tc.term))
			}
			if err := c.shared.Commit(ctx, ops); err != nil {
				t.Fatal(err)
			}
			a := c.start("a", c.shared)
			a.expect(fmt.Sprintf("leader a %d", tc.want), fmt.Sprintf("elected %d", tc.want))
			a.expectLeading(tc.want)
			c.expectRecord("a", tc.want, 0)
		})
	}

	t.Run("while leading", func(t *testing.T) {
		c := newCluster(t)
		a := c.start("a", c.shared)
		a.expect("leader a 1", "elected 1")
		c.tl.advanceTo(at(2 * time.Second))
		if err := c.shared.Commit(ctx, []kv.Op{kv.Put(coder.MetaKey(leaseName), []byte{9})}); err != nil {
			t.Fatal(err)
		}
		c.tl.advanceTo(at(3 * time.Second))
		a.expect("stepped down", "leader a 2", "elected 2")
		a.expectLeading(2)
		c.expectRecord("a", 2, 0)
	})
}

// TestElectedErrorStepsDown: when the server cannot take up leadership the
// node steps down, and the next round tries again with a new term.
func TestElectedErrorStepsDown(t *testing.T) {
	c := newCluster(t)
	n := c.startWith("a", c.shared, func(n *node) { n.electErrs = []error{errors.New("recovery failed")} })
	n.expect("leader a 1", "elected 1", "stepped down", "leader none")
	n.expectFollowing()
	first := n.takeLeaderCtx()
	if first.Err() == nil {
		t.Fatal("the first term's context is still live")
	}
	c.tl.advance(testRenew)
	n.expect("leader a 2", "elected 2")
	n.expectLeading(2)
	if n.takeLeaderCtx().Err() != nil {
		t.Fatal("the second term's context ended")
	}
}

// TestCancelStepsDown: ending Run's context steps the leader down.
func TestCancelStepsDown(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", c.shared)
	a.expect("leader a 1", "elected 1")
	c.tl.advanceTo(at(2 * time.Second))
	lctx := a.takeLeaderCtx()
	a.stop()
	a.expect("stepped down")
	a.expectFollowing()
	if lctx.Err() == nil {
		t.Fatal("Elected's context is still live after Run returned")
	}
	// A follower's Run ends without callbacks.
	b := c.start("b", c.shared)
	b.expect("leader a 1")
	b.stop()
	b.expect()
}

// TestFollowerForgetsSilentLeader: a follower that cannot read the record
// for a whole lease after it last saw it change reports no leader.
func TestFollowerForgetsSilentLeader(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", c.shared)
	fb := kvfault.Wrap(c.shared)
	b := c.start("b", fb)
	b.expect("leader a 1")
	c.tl.advanceTo(at(2 * time.Second))
	fb.Partition(errors.New("partitioned"))
	c.tl.advanceTo(at(6*time.Second - time.Nanosecond))
	b.expect()
	c.tl.advanceTo(at(6 * time.Second))
	b.expect("leader none")
	fb.Heal()
	c.tl.advanceTo(at(7 * time.Second))
	b.expect("leader a 1")
	b.expectFollowing()
	a.expectLeading(1)
}

// TestRandomFaults runs three electors through seeded random store faults
// (uncertain commits applied or not, failed calls, partitions) and checks
// the invariant at every event; once the faults stop, one leader emerges.
func TestRandomFaults(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			c := newCluster(t)
			var faults []*faultSwitch
			var nodes []*node
			for i := range 3 {
				f := &faultSwitch{Store: kvfault.Wrap(c.shared), clean: c.shared}
				faults = append(faults, f)
				nodes = append(nodes, c.start(fmt.Sprintf("n%d", i), f))
				// Start them out of step, so their rounds interleave.
				c.tl.advance(time.Duration(rng.IntN(1000)) * time.Millisecond)
			}
			failed := errors.New("injected failure")
			for range 400 {
				f := faults[rng.IntN(len(faults))]
				switch rng.IntN(10) {
				case 0:
					f.FailCommits(kvfault.Fault{Err: errUncertain, Apply: true})
				case 1:
					f.FailCommits(kvfault.Fault{Err: errUncertain})
				case 2:
					f.FailCommits(kvfault.Fault{Err: failed})
				case 3:
					f.FailGets(kvfault.Fault{Err: failed})
				case 4:
					f.Partition(failed)
				case 5, 6:
					f.Heal()
				}
				c.tl.advance(time.Duration(1+rng.IntN(1500)) * time.Millisecond)
			}
			for _, f := range faults {
				f.off.Store(true)
			}
			// One leader emerges within a few leases.
			c.tl.advance(3 * testLease)
			leaders := 0
			for _, n := range nodes {
				if n.e.IsLeader() && n.fenceTerm() > 0 {
					leaders++
				}
			}
			if leaders != 1 {
				t.Fatalf("%d leaders after the faults stopped", leaders)
			}
			if c.leaders == 0 {
				t.Fatal("the invariant never saw a leader")
			}
		})
	}
}
