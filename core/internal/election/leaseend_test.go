package election

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/engramkv/engram/core/internal/clock/fakeclock"
	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
)

// A leader's lease ends on time whatever the store does: a renewal that
// hangs, fails, is slow or loses its compare-and-swap.

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
			c.clk.AdvanceTo(at(5 * time.Second))

			// At 6 s a's round hangs in the store.
			ha.holdNext(a.clock, call == "Commit")
			c.clk.AdvanceTo(at(6 * time.Second))
			c.clk.AdvanceTo(at(9*time.Second - time.Nanosecond))
			a.expectLeading(1)
			a.expect()
			select {
			case err := <-ha.released:
				t.Fatalf("held call ended early: %v", err)
			default:
			}

			// Its lease (from 5 s) ends at 9 s: b takes over (its tick
			// comes first) and a, held, steps down at the same instant.
			c.clk.AdvanceTo(at(9 * time.Second))
			a.expect("stepped down", "leader none")
			a.expectFollowing()
			b.expect("leader b 2", "elected 2")
			b.expectLeading(2)
			select {
			case err := <-ha.released:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("held call ended with %v", err)
				}
			case <-time.After(fakeclock.Watchdog):
				t.Fatal("held call was not cancelled")
			}
			c.expectRecord("b", 2, 0)

			c.clk.Advance(testRenew)
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
	c.clk.AdvanceTo(at(2 * time.Second))
	ha.holdNext(a.clock, true)
	c.clk.AdvanceTo(at(6*time.Second - time.Nanosecond))
	a.expectLeading(1)
	c.clk.Advance(time.Nanosecond)
	a.expect("stepped down", "leader none")
	a.expectFollowing()
	<-ha.released
	// The record still names a: the next round claims it at once.
	c.clk.AdvanceTo(at(7 * time.Second))
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
	sa := &slowStore{Store: c.shared, clk: c.clk, d: 300 * time.Millisecond}
	a := c.start("a", sa)
	// Claimed in the round that began at 0 and ended at 0.9 s.
	a.expect("leader a 1", "elected 1")
	sa.failing.Store(true)
	c.clk.AdvanceTo(at(4*time.Second - time.Nanosecond))
	a.expectLeading(1)
	c.clk.AdvanceTo(at(4 * time.Second))
	a.expect("stepped down", "leader none")
	a.expectFollowing()

	sa.failing.Store(false)
	c.clk.AdvanceTo(at(5 * time.Second)) // claims again: the round starts at 5 s
	a.expect("leader a 2", "elected 2")
	c.clk.AdvanceTo(at(6 * time.Second)) // renewed in the round from 6 s to 6.6 s
	c.expectRecord("a", 2, 1)
	sa.failing.Store(true)
	c.clk.AdvanceTo(at(10*time.Second - time.Nanosecond))
	a.expectLeading(2)
	c.clk.AdvanceTo(at(10 * time.Second))
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
	c.clk.AdvanceTo(at(2 * time.Second))
	fa.Partition(errors.New("partitioned"))
	c.clk.AdvanceTo(at(5500*time.Millisecond - time.Nanosecond))
	a.expectLeading(1)
	a.expect()
	c.clk.AdvanceTo(at(5500 * time.Millisecond))
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
		c.clk.AdvanceTo(at(3 * time.Second))
		ha.before = usurp(c, true)
		c.clk.AdvanceTo(at(4 * time.Second))
		a.expect("stepped down", "leader none")
		a.expectFollowing()
		b.expect("leader x 2")
		c.clk.Advance(testRenew)
		a.expect("leader x 2")
	})

	t.Run("term record", func(t *testing.T) {
		c := newCluster(t)
		ha := &hookStore{Store: c.shared}
		a := c.start("a", ha)
		a.expect("leader a 1", "elected 1")
		c.clk.AdvanceTo(at(3 * time.Second))
		ha.before = usurp(c, false)
		c.clk.AdvanceTo(at(4 * time.Second))
		// The fence op of the renewal failed.
		a.expect("stepped down", "leader none")
		a.expectFollowing()
		// The lease record still names a, so it claims it again at once,
		// above the term it found.
		c.clk.Advance(testRenew)
		a.expect("leader a 3", "elected 3")
		a.expectLeading(3)
		c.expectRecord("a", 3, 0)
	})
}
