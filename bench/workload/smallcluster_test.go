package workload_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/bench/workload"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
)

// TestSmallClusterAgainstEngram runs a tiny cluster through its life: no
// request fails, the objects the workload says it left are what the store
// holds, one pod in five was replaced, and every node was written more than
// once.
func TestSmallClusterAgainstEngram(t *testing.T) {
	srv := servertest.Start(t, memkv.New(), servertest.Options{})
	cfg := small(srv.Endpoint)
	cfg.ClusterPods, cfg.ClusterNodes = 50, 5
	cfg.Prefix = "/small/"
	cfg.Cleanup = false
	rep, err := workload.Run(context.Background(), cfg, []string{workload.SmallCluster})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	r := byName(t, rep)[workload.SmallCluster]
	if r.Errors != 0 {
		t.Fatalf("small cluster: %d errors %v", r.Errors, r.ErrorSamples)
	}
	// 5 nodes and 5 leases, 50 pods of which 10 were replaced.
	if r.Keys != 60 || r.LiveBytes < 50*3<<10+5*8<<10 {
		t.Errorf("small cluster left %d objects of %d bytes", r.Keys, r.LiveBytes)
	}
	ctx := context.Background()
	cli := srv.Client(t)
	count := func(prefix string) int64 {
		t.Helper()
		resp, err := cli.Get(ctx, cfg.Prefix+"registry/"+prefix, clientWithPrefix()...)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	if n, l, p := count("minions/"), count("leases/"), count("pods/"); n != 5 || l != 5 || p != 50 {
		t.Errorf("store holds %d nodes, %d leases, %d pods; want 5, 5, 50", n, l, p)
	}
	resp, err := cli.Get(ctx, cfg.Prefix+"registry/minions/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		// Created, then 5 status writes.
		if kv.Version != 6 || len(kv.Value) != 8<<10 {
			t.Errorf("node %s: version %d, %d bytes; want version 6 of 8 KiB", kv.Key, kv.Version, len(kv.Value))
		}
	}
	// Writes: 10 node and lease creates, 150 lease renewals, 25 node
	// updates, 50 pod creates, 200 pod updates, 10 deletes, 10 creates and
	// 40 updates of the replacements.
	if r.Writes != 495 {
		t.Errorf("%d writes, want 495", r.Writes)
	}
	if r.Pages == 0 {
		t.Error("no list page read")
	}
}
