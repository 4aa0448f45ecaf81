package server_test

import (
	"testing"

	"github.com/engramkv/engram/core/internal/clock/fakeclock"
	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/engines/memkv"
)

// gauge is the value of an unlabelled gauge or counter on n's /metrics.
func gauge(t *testing.T, n *metricsNode, name string) float64 {
	t.Helper()
	f, ok := scrape(t, n.url)[name]
	if !ok {
		t.Fatalf("%s: missing", name)
	}
	m := f.GetMetric()[0]
	return m.GetGauge().GetValue() + m.GetCounter().GetValue()
}

// TestEtcdMetricsCluster checks the role metrics in cluster mode, as etcd
// reports them on each member: every member that knows a leader (itself or
// the one it forwards to) has one, only the leader is leader, and a
// failover is one more leader change seen by the member that stays.
func TestEtcdMetricsCluster(t *testing.T) {
	t.Parallel()
	shared := memkv.New()
	t.Cleanup(func() { _ = shared.Close() })
	clk := fakeclock.New(t, clusterStart)
	start := func(name string) *metricsNode {
		loop := clk.Loop()
		n := startMetricsNode(t, server.Options{Store: shared, Name: name, Clock: clk,
			Cluster: server.ClusterOptions{Enabled: true, LeaseDuration: testLease, RenewInterval: testRenew, Clock: loop}})
		loop.WaitIdle()
		return n
	}
	a, b := start("a"), start("b")
	nodes := []*metricsNode{a, b}
	known := func(n *metricsNode) bool { _, ok := n.srv.Leader(); return ok }
	stepUntil(t, clk, "leader known to both", func() bool {
		return known(a) && known(b) && (a.srv.IsLeader() || b.srv.IsLeader())
	})
	leader, follower := a, b
	if b.srv.IsLeader() {
		leader, follower = b, a
	}
	for _, n := range nodes {
		if v := gauge(t, n, "etcd_server_has_leader"); v != 1 {
			t.Errorf("etcd_server_has_leader %v, want 1", v)
		}
	}
	if v := gauge(t, leader, "etcd_server_is_leader"); v != 1 {
		t.Errorf("leader: etcd_server_is_leader %v", v)
	}
	if v := gauge(t, follower, "etcd_server_is_leader"); v != 0 {
		t.Errorf("follower: etcd_server_is_leader %v", v)
	}
	before := gauge(t, follower, "etcd_server_leader_changes_seen_total")
	if before < 1 {
		t.Errorf("follower: etcd_server_leader_changes_seen_total %v, want at least the first leader", before)
	}
	leader.stop()
	stepUntil(t, clk, "failover", follower.srv.IsLeader)
	if v := gauge(t, follower, "etcd_server_leader_changes_seen_total"); v != before+1 {
		t.Errorf("after failover: etcd_server_leader_changes_seen_total %v, want %v", v, before+1)
	}
	if v := gauge(t, follower, "etcd_server_has_leader"); v != 1 {
		t.Errorf("new leader: etcd_server_has_leader %v", v)
	}
}
