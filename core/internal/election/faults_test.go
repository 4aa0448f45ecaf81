package election

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/engramkv/engram/core/kv/kvfault"
)

// Uncertain commit answers, and random store faults against the safety
// invariant.

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
	c.clk.AdvanceTo(at(3 * time.Second))

	fa.FailCommits(kvfault.Fault{Err: errUncertain}, kvfault.Fault{Err: errUncertain, Apply: true})
	c.clk.AdvanceTo(at(4 * time.Second)) // not applied
	c.expectRecord("a", 1, 3)
	c.clk.AdvanceTo(at(5 * time.Second)) // applied: a does not know
	c.expectRecord("a", 1, 4)
	a.expectLeading(1)
	c.clk.AdvanceTo(at(6 * time.Second)) // renewed
	c.expectRecord("a", 1, 5)
	c.clk.AdvanceTo(at(10*time.Second - time.Nanosecond))
	a.expectLeading(1) // from the renewal at 6 s, not the last one at 9 s
	a.expect()
	b.expect()

	// From 10 s on, every renewal answer is uncertain; the ones at 11 s and
	// 13 s were applied. The last sure renewal started at 10 s.
	c.clk.AdvanceTo(at(10 * time.Second))
	fa.FailCommits(
		kvfault.Fault{Err: errUncertain, Apply: true},
		kvfault.Fault{Err: errUncertain},
		kvfault.Fault{Err: errUncertain, Apply: true},
	)
	c.clk.AdvanceTo(at(14*time.Second - time.Nanosecond))
	a.expectLeading(1)
	c.expectRecord("a", 1, 11)
	c.clk.AdvanceTo(at(14 * time.Second))
	a.expect("stepped down", "leader none")
	a.expectFollowing()
	b.expect()
	b.expectFollowing()
	// The record still names a (b saw it change at 13 s and waits): a
	// claims it at once in its next round.
	c.clk.AdvanceTo(at(15 * time.Second))
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
			c.clk.AdvanceTo(at(5 * time.Second))
			fa.Partition(errors.New("partitioned"))
			fb.FailCommits(kvfault.Fault{Err: errUncertain, Apply: applied})

			c.clk.AdvanceTo(at(9 * time.Second))
			a.expect("stepped down", "leader none")
			b.expect("leader none")
			b.expectFollowing()
			if applied {
				c.expectRecord("b", 2, 0)
			} else {
				c.expectRecord("a", 1, 5)
			}

			c.clk.AdvanceTo(at(10 * time.Second))
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
			c.clk.Advance(testRenew)
			a.expect(fmt.Sprintf("leader b %d", term))
			a.expectFollowing()
		})
	}
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
				c.clk.Advance(time.Duration(rng.IntN(1000)) * time.Millisecond)
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
				c.clk.Advance(time.Duration(1+rng.IntN(1500)) * time.Millisecond)
			}
			for _, f := range faults {
				f.off.Store(true)
			}
			// One leader emerges within a few leases.
			c.clk.Advance(3 * testLease)
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
