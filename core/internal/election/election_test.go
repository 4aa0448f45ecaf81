package election

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
)

// The tests run electors on a fake clock (see cluster): time moves only
// when a test advances it, and each tick wakes one loop at a time, so every
// schedule below is exact. Leases are 4 s and rounds 1 s; electors started
// together tick together, the first started first.
//
// This file holds taking over, following and stepping down in the ordinary
// course; leaseend_test.go a leader's lease running out while the store is
// slow, hangs or is changed under it; faults_test.go uncertain answers and
// random faults.

func TestLoneNodeTakesOverAndRenews(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", c.shared)
	// The first round runs at once: the store is empty, a takes over.
	a.expect("leader a 1", "elected 1")
	a.expectLeading(1)
	c.expectRecord("a", 1, 0)

	// It renews every round, so it leads on past many leases.
	c.clk.AdvanceTo(at(10 * time.Second))
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
	c.clk.Advance(5 * testLease)
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
			c.clk.AdvanceTo(at(5 * time.Second))
			c.expectRecord("a", 1, 5)
			if how == "Run stopped" {
				a.stop()
				a.expect("stepped down")
				a.expectFollowing()
			} else {
				fa.Partition(errors.New("partitioned"))
			}

			c.clk.AdvanceTo(at(9*time.Second - time.Nanosecond))
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
			c.clk.AdvanceTo(at(9 * time.Second))
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
				c.clk.Advance(testRenew)
				a.expect("leader b 2")
				a.expectFollowing()
			}
			c.clk.Advance(3 * testLease)
			b.expectLeading(2)
			c.expectRecord("b", 2, int((c.elapsed()-9*time.Second)/testRenew))
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
		c.clk.AdvanceTo(at(2 * time.Second))
		if err := c.shared.Commit(ctx, []kv.Op{kv.Put(coder.MetaKey(leaseName), []byte{9})}); err != nil {
			t.Fatal(err)
		}
		c.clk.AdvanceTo(at(3 * time.Second))
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
	c.clk.Advance(testRenew)
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
	c.clk.AdvanceTo(at(2 * time.Second))
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
	c.clk.AdvanceTo(at(2 * time.Second))
	fb.Partition(errors.New("partitioned"))
	c.clk.AdvanceTo(at(6*time.Second - time.Nanosecond))
	b.expect()
	c.clk.AdvanceTo(at(6 * time.Second))
	b.expect("leader none")
	fb.Heal()
	c.clk.AdvanceTo(at(7 * time.Second))
	b.expect("leader a 1")
	b.expectFollowing()
	a.expectLeading(1)
}
