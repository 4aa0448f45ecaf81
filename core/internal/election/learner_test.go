package election

import (
	"context"
	"sync/atomic"
	"testing"
)

// TestLearnerNeverCampaigns: a node whose Candidate says no follows the
// leader, and when the leader is gone it reports no leader instead of
// taking over, however long it waits; once Candidate says yes it claims at
// its next round.
func TestLearnerNeverCampaigns(t *testing.T) {
	c := newCluster(t)
	var voter atomic.Bool
	var asked atomic.Int32
	l := c.startWith("l", c.shared, func(n *node) {
		n.candidate = func(context.Context) bool { asked.Add(1); return voter.Load() }
	})
	l.expect()
	if asked.Load() == 0 {
		t.Fatal("the learner claimed nothing, but was never asked whether it may")
	}
	if _, _, ok := c.record(); ok {
		t.Fatal("a learner alone wrote a lease record")
	}
	a := c.start("a", c.shared)
	a.expect("leader a 1", "elected 1")
	c.clk.Advance(testRenew)
	l.expect("leader a 1")

	a.stop()
	a.expect("stepped down")
	c.clk.Advance(3 * testLease)
	l.expect("leader none")
	l.expectFollowing()
	c.expectRecord("a", 1, -1)

	voter.Store(true)
	c.clk.Advance(testRenew)
	l.expect("leader l 2", "elected 2")
	l.expectLeading(2)
}

// TestSetURLReachesFollowers: a leader's new URL goes out with its next
// renewal, and its followers report the leader again with it.
func TestSetURLReachesFollowers(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", c.shared)
	b := c.start("b", c.shared)
	a.expect("leader a 1", "elected 1")
	b.expect("leader a 1")
	a.e.SetURL("http://a-moved")
	c.clk.Advance(testRenew)
	rec, _, _ := c.record()
	if rec.URL != "http://a-moved" || rec.Holder != "a" || rec.Term != 1 {
		t.Fatalf("record after the renewal: %+v", rec)
	}
	b.expect("leader a 1")
	if got, ok := b.e.Leader(); !ok || got.URL != "http://a-moved" {
		t.Fatalf("b follows %+v (%v), want the moved URL", got, ok)
	}
	a.expectLeading(1)
}
