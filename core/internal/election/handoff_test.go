package election

import (
	"context"
	"errors"
	"testing"
	"time"
)

// handoff asks n's elector for a hand-off to target and finishes it in the
// background; the result arrives on the returned channel.
func handoff(t *testing.T, n *node, target string) <-chan error {
	t.Helper()
	req, err := n.e.askHandoff(target)
	if err != nil || req == nil {
		t.Fatalf("ask hand-off to %s: %v, %v", target, req, err)
	}
	res := make(chan error, 1)
	go func() { res <- n.e.finishHandoff(context.Background(), req) }()
	return res
}

func result(t *testing.T, res <-chan error) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the hand-off did not return")
		return nil
	}
}

// TestHandoff: the leader stops fencing at the call, hands off at its next
// round, the target claims at its next round with a new term (before any
// lease could end), and a write fenced with the old term fails.
func TestHandoff(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", c.shared)
	b := c.start("b", c.shared)
	x := c.start("c", c.shared)
	c.clk.Advance(testRenew)
	a.expectLeading(1)

	res := handoff(t, a, "b")
	if a.fenceTerm() != 0 {
		t.Fatal("the leader still fences after asking for a hand-off")
	}
	// One round writes the hand-off, at most one more lets b claim it.
	c.clk.Advance(testRenew)
	c.clk.Advance(testRenew)
	if c.elapsed() >= testLease {
		t.Fatal("the test must run before any lease could end")
	}
	b.expectLeading(2)
	c.expectRecord("b", 2, -1)
	if err := result(t, res); err != nil {
		t.Fatalf("hand-off: %v", err)
	}
	a.expectFollowing()
	x.expectFollowing()
	if err := c.fencedCommit(1); !IsFenced(err) {
		t.Fatalf("a term 1 write after the hand-off: %v, want fenced", err)
	}
	if err := c.fencedCommit(2); err != nil {
		t.Fatalf("term 2 write: %v", err)
	}
	c.clk.Advance(testRenew)
	if l, ok := x.e.Leader(); !ok || l.Holder != "b" {
		t.Fatalf("c knows leader %+v (%v), want b", l, ok)
	}
}

// TestHandoffToDeadTarget: a target that stops before claiming leaves the
// cluster leaderless for at most one lease; the old leader claims again with
// a new term and the hand-off fails.
func TestHandoffToDeadTarget(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", c.shared)
	b := c.start("b", c.shared)
	c.clk.Advance(testRenew)
	a.expectLeading(1)

	res := handoff(t, a, "b")
	b.stop()
	c.clk.Advance(testRenew)
	rec, _, _ := c.record()
	if rec.Handoff != "b" || rec.Holder != "a" {
		t.Fatalf("record after the hand-off round: %+v", rec)
	}
	handedAt := c.elapsed()
	a.expectFollowing()
	c.clk.AdvanceTo(at(handedAt + testLease))
	a.expectLeading(2)
	c.expectRecord("a", 2, -1)
	if err := result(t, res); !errors.Is(err, ErrHandoffFailed) {
		t.Fatalf("hand-off to a dead target: %v, want ErrHandoffFailed", err)
	}
}

// TestHandoffAnswers: only the leader hands off; a hand-off to itself is
// done at once.
func TestHandoffAnswers(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", c.shared)
	b := c.start("b", c.shared)
	ctx := context.Background()
	if err := b.e.Handoff(ctx, "a"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("hand-off from a follower: %v, want ErrNotLeader", err)
	}
	if err := a.e.Handoff(ctx, "a"); err != nil {
		t.Fatalf("hand-off to the leader itself: %v", err)
	}
	a.expectLeading(1)
}
