package server_test

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/internal/etcdtest"
)

// leaseDay grants two leases (one below etcd's minimum TTL), renews the
// first three times, keeps alive a lease that does not exist, and revokes
// the second.
func leaseDay(t *testing.T, endpoint string) {
	t.Helper()
	ctx, conn := rawConn(t, endpoint)
	lc := pb.NewLeaseClient(conn)
	a, err := lc.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		t.Fatal(err)
	}
	b, err := lc.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 1})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := lc.LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{a.ID, a.ID, a.ID, 12345} {
		if err := ka.Send(&pb.LeaseKeepAliveRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
		if _, err := ka.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	_ = ka.CloseSend()
	if _, err := lc.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: b.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := lc.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: b.ID}); err == nil {
		t.Fatal("second revoke succeeded")
	}
}

// TestEtcdLeaseMetricsMatchEtcd runs the same lease requests on etcd 3.6
// and Engram and compares etcd's lessor metrics value for value.
func TestEtcdLeaseMetricsMatchEtcd(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t, etcdtest.Options{})
	endpoint, url := metricsEngram(t)
	leaseDay(t, e.Endpoint)
	leaseDay(t, endpoint)
	etcd, engram := scrape(t, e.ClientURL+"/metrics"), scrape(t, url)
	for _, name := range []string{
		"etcd_debugging_lease_granted_total", "etcd_debugging_lease_revoked_total",
		"etcd_debugging_lease_renewed_total", "etcd_debugging_lease_ttl_total",
	} {
		ef, f := etcd[name], engram[name]
		if ef == nil || f == nil {
			t.Errorf("%s: etcd has it %v, Engram %v", name, ef != nil, f != nil)
			continue
		}
		em, m := ef.GetMetric()[0], f.GetMetric()[0]
		t.Logf("%s: counter %v, TTL sum %v (etcd: %v, %v)", name, m.GetCounter().GetValue(), m.GetHistogram().GetSampleSum(), em.GetCounter().GetValue(), em.GetHistogram().GetSampleSum())
		if em.GetCounter().GetValue() != m.GetCounter().GetValue() {
			t.Errorf("%s: %v, etcd %v", name, m.GetCounter().GetValue(), em.GetCounter().GetValue())
		}
		if eh, h := em.GetHistogram(), m.GetHistogram(); eh.GetSampleCount() != h.GetSampleCount() || eh.GetSampleSum() != h.GetSampleSum() {
			t.Errorf("%s: %d TTLs summing %v, etcd %d summing %v", name, h.GetSampleCount(), h.GetSampleSum(), eh.GetSampleCount(), eh.GetSampleSum())
		}
	}
}
