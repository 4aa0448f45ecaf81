package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
)

// TestQuotaMeasuresOncePerWindow: under a quota, writes do not ask the
// engine for its size one by one: at most once per second of writing (the
// quota's window), plus the first measure.
func TestQuotaMeasuresOncePerWindow(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	store := &sizedStore{Store: memkv.New()}
	srv := servertest.Start(t, store, servertest.Options{QuotaBackendBytes: 1 << 30})
	c := pb.NewKVClient(srv.Client(t).ActiveConnection())
	const writes = 300
	before, start := store.calls.Load(), time.Now()
	for i := range writes {
		if _, err := c.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	// An upper bound from the time the writes took, not a speed
	// requirement: a slow run is allowed more measures.
	calls, limit := store.calls.Load()-before, int64(time.Since(start)/time.Second)+2
	t.Logf("%d writes measured the store %d times", writes, calls)
	if calls > limit || calls >= writes {
		t.Errorf("%d writes measured the store %d times, want at most %d", writes, calls, limit)
	}
}

// TestQuotaMetric: with a quota, /metrics carries etcd's
// etcd_server_quota_backend_bytes with the quota, as the etcd mixin's
// low-space alert reads it.
func TestQuotaMetric(t *testing.T) {
	t.Parallel()
	const quota = 8 << 20
	n := startMetricsNode(t, server.Options{Store: &sizedStore{Store: memkv.New()}, Name: "quota", QuotaBackendBytes: quota})
	f, ok := scrape(t, n.url)["etcd_server_quota_backend_bytes"]
	if !ok {
		t.Fatal("etcd_server_quota_backend_bytes: missing")
	}
	if f.GetType() != dto.MetricType_GAUGE || f.GetHelp() != "Current backend storage quota size in bytes." || f.GetMetric()[0].GetGauge().GetValue() != quota {
		t.Errorf("etcd_server_quota_backend_bytes: %v", f)
	}
}
