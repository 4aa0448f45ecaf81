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
	go func() { res <- n.e.finishHandoff(context.Background(), req, nil) }()
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

// TestHandoff: the leader stops fencing at the call and hands off at once,
// without waiting for its next tick; the target claims at its next round
// with a new term (before any lease could end), and a write fenced with the
// old term fails.
func TestHandoff(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", c.shared)
	b := c.start("b", c.shared)
	x := c.start("c", c.shared)
	c.clk.Advance(testRenew)
	a.expectLeading(1)

	asked := c.elapsed()
	res := handoff(t, a, "b")
	if a.fenceTerm() != 0 {
		t.Fatal("the leader still fences after asking for a hand-off")
	}
	if rec, _, _ := c.record(); rec.Holder != "a" || rec.Handoff != "b" || c.elapsed() != asked {
		t.Fatalf("record at the call, with no tick: %+v, want a handing off to b", rec)
	}
	a.expectFollowing()
	// b's next round claims it.
	c.clk.Advance(testRenew)
	if c.elapsed() >= testLease {
		t.Fatal("the test must run before any lease could end")
	}
	b.expectLeading(2)
	c.expectRecord("b", 2, -1)
	if err := c.fencedCommit(1); !IsFenced(err) {
		t.Fatalf("a term 1 write after the hand-off: %v, want fenced", err)
	}
	if err := c.fencedCommit(2); err != nil {
		t.Fatalf("term 2 write: %v", err)
	}
	// The others' next round sees b lead; the hand-off returns once a does.
	c.clk.Advance(testRenew)
	if err := result(t, res); err != nil {
		t.Fatalf("hand-off: %v", err)
	}
	a.expectFollowing()
	x.expectFollowing()
	for _, n := range []*node{a, x} {
		if l, ok := n.e.Leader(); !ok || l.Holder != "b" {
			t.Fatalf("%s knows leader %+v (%v), want b", n.id, l, ok)
		}
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

	b.stop()
	handedAt := c.elapsed()
	res := handoff(t, a, "b")
	rec, _, _ := c.record()
	if rec.Handoff != "b" || rec.Holder != "a" {
		t.Fatalf("record after the hand-off round: %+v", rec)
	}
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
	if err := b.e.Handoff(ctx, "a", nil); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("hand-off from a follower: %v, want ErrNotLeader", err)
	}
	if err := a.e.Handoff(ctx, "a", nil); err != nil {
		t.Fatalf("hand-off to the leader itself: %v", err)
	}
	a.expectLeading(1)
}

// TestHandoffWokenPeers: with the target and the others woken (Wake) once
// the hand-off record is written, leadership changes hands and every node
// knows it without any tick: the hand-off takes store round trips, not
// renew intervals.
func TestHandoffWokenPeers(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", c.shared)
	b := c.start("b", c.shared)
	x := c.start("c", c.shared)
	c.clk.Advance(testRenew)
	a.expectLeading(1)

	asked := c.elapsed()
	req, err := a.e.askHandoff("b")
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	woken := make(chan struct{})
	go func() {
		res <- a.e.finishHandoff(context.Background(), req, func() { b.e.Wake(); close(woken) })
	}()
	<-woken
	b.clock.WaitIdle()
	b.expectLeading(2)
	// b, elected, wakes the others (the server does it from Elected).
	a.e.Wake()
	x.e.Wake()
	if err := result(t, res); err != nil {
		t.Fatalf("hand-off: %v", err)
	}
	if c.elapsed() != asked {
		t.Fatalf("the hand-off waited %v of clock time, want none", c.elapsed()-asked)
	}
	for _, n := range []*node{a, x} {
		n.clock.WaitIdle()
		if l, ok := n.e.Leader(); !ok || l.Holder != "b" {
			t.Fatalf("%s knows leader %+v (%v), want b", n.id, l, ok)
		}
	}
	c.checkInvariant()
}
