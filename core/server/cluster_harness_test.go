package server_test

import (
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/core/internal/clock/fakeclock"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
)

// The cluster tests run real elections on a fake clock. The members share
// one fakeclock.Clock (leases, progress notifications); each member's
// election runs on its own fakeclock.Loop view of it, so that advancing the
// clock returns once every election has run the round it woke for. Time
// moves only when a test steps it: a failover happens when the test
// advances past the lease, never after a real wait, however loaded the
// machine. The tests assert outcomes, never how soon something happened
// (that is for the benchmarks).
const (
	testLease = time.Second
	testRenew = testLease / 4
)

// awaitLimit is how much fake time await may step through: many leases, so
// that it only turns an election that never settles into a failure.
const awaitLimit = 20 * testLease

// hangGuard bounds each wait of these tests on something other than the
// fake clock (a write, a watch event). It only turns a hang into a failure,
// so it is far above anything a loaded machine needs.
const hangGuard = time.Minute

// clusterStart is where every cluster's fake time starts.
var clusterStart = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

type cluster struct {
	t      *testing.T
	clk    *fakeclock.Clock
	shared *memkv.Store
	nodes  []*servertest.Server
	loops  []*fakeclock.Loop // each node's election clock
	names  []string
	stores []*kvfault.Store // startCluster's and join's nodes only
}

func newCluster(t *testing.T) *cluster {
	return &cluster{t: t, clk: fakeclock.New(t, clusterStart), shared: memkv.New()}
}

// startCluster runs n nodes over one shared in-memory store; each node sees
// the store through its own fault wrapper so a test can partition it.
func startCluster(t *testing.T, n int) *cluster {
	c := newCluster(t)
	for i := range n {
		st := kvfault.Wrap(c.shared)
		c.stores = append(c.stores, st)
		c.add(fmt.Sprintf("node%d", i), st, servertest.Options{ProgressNotifyInterval: 200 * time.Millisecond})
	}
	return c
}

// add starts a member named name over store (the shared store, or a wrapper
// of it) with opts, whose Name, Clock and Cluster it sets, and returns its
// index once the member's first election round is over.
func (c *cluster) add(name string, store kv.Store, opts servertest.Options) int {
	c.t.Helper()
	loop := c.clk.Loop()
	opts.Name = name
	opts.Clock = c.clk
	opts.Cluster = c.options(loop)
	c.nodes = append(c.nodes, servertest.Start(c.t, store, opts))
	c.names = append(c.names, name)
	c.loops = append(c.loops, loop)
	loop.WaitIdle()
	return len(c.nodes) - 1
}

// options returns the cluster options of a member whose election runs on
// loop.
func (c *cluster) options(loop *fakeclock.Loop) *server.ClusterOptions {
	return &server.ClusterOptions{LeaseDuration: testLease, RenewInterval: testRenew, Clock: loop}
}

// step advances the clock by one renew interval: every running election
// runs one round.
func (c *cluster) step() { c.clk.Advance(testRenew) }

// await steps the clock until cond holds, and fails the test when it does
// not within awaitLimit of fake time.
func (c *cluster) await(what string, cond func() bool) {
	c.t.Helper()
	stepUntil(c.t, c.clk, what, cond)
}

// stepUntil advances clk a renew interval at a time until cond holds, and
// fails t when it does not within awaitLimit of fake time. Each step
// returns once the elections on Loop views of clk have run their rounds, so
// cond sees what they did.
func stepUntil(t testing.TB, clk *fakeclock.Clock, what string, cond func() bool) {
	t.Helper()
	start := clk.Now()
	for !cond() {
		if passed := clk.Now().Sub(start); passed >= awaitLimit {
			t.Fatalf("still no %s after %v on the fake clock", what, passed)
		}
		clk.Advance(testRenew)
	}
}

// leader waits until a node other than exclude serves as leader and
// returns it.
func (c *cluster) leader(exclude int) int {
	c.t.Helper()
	found := -1
	c.await(fmt.Sprintf("leader other than node %d", exclude), func() bool {
		found = c.leading(exclude)
		return found >= 0
	})
	return found
}

// leading returns a node other than exclude that serves as leader, or -1.
func (c *cluster) leading(exclude int) int {
	for i, n := range c.nodes {
		if i != exclude && n.IsLeader() {
			return i
		}
	}
	return -1
}

// following waits until node i forwards to node l.
func (c *cluster) following(i, l int) {
	c.t.Helper()
	c.await(fmt.Sprintf("node %d following node %d", i, l), func() bool {
		name, ok := c.nodes[i].Leader()
		return ok && name == c.names[l]
	})
}

// failover advances the clock after node old stopped leading (killed or
// partitioned, at the current fake time): for most of a lease no other node
// takes over, as the others still follow old; then one does, within a few
// rounds of the lease's end. It returns the new leader.
func (c *cluster) failover(old int) int {
	c.t.Helper()
	lost := c.clk.Now()
	// The last renewal was at most a round before now; the lease runs a
	// whole lease from it.
	for c.clk.Now().Sub(lost) < testLease-2*testRenew {
		c.step()
		if l := c.leading(old); l >= 0 {
			c.t.Fatalf("node %d took over %v after node %d stopped leading, before its lease could end", l, c.clk.Now().Sub(lost), old)
		}
	}
	for i, n := range c.nodes {
		if name, ok := n.Leader(); i != old && ok && name != c.names[old] {
			c.t.Fatalf("node %d follows node %q before node %d's lease could end", i, name, old)
		}
	}
	next := -1
	for next < 0 {
		if passed := c.clk.Now().Sub(lost); passed > testLease+4*testRenew {
			c.t.Fatalf("no node took over %v after node %d stopped leading", passed, old)
		}
		c.step()
		next = c.leading(old)
	}
	return next
}

func (c *cluster) client(idx ...int) *clientv3.Client {
	var eps []string
	for _, i := range idx {
		eps = append(eps, c.nodes[i].Endpoint)
	}
	cl, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}
