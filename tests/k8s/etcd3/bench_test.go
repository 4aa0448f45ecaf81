package etcd3

import (
	"fmt"
	"testing"

	storagetesting "k8s.io/apiserver/pkg/storage/testing"
)

// The suite's store benchmarks (not part of `go test`; run with -bench).
// Upstream sizes them after the Kubernetes scalability thresholds (up to
// 150k pods per data set); here smaller data sets keep the set-up under a
// minute on a small machine. Compare backends with benchstat:
//
//	go test -run '^$' -bench . -benchtime 200x ./etcd3/ > engram.txt
//	go test -tags etcdref -run '^$' -bench . -benchtime 200x ./etcd3/ > etcd.txt

// BenchmarkStoreWriteThroughput measures creates, deletes and updates by 25
// writers, alone and beside watchers, listers and watch-lists (1.37's
// replacement of RunBenchmarkStoreListCreate).
func BenchmarkStoreWriteThroughput(b *testing.B) {
	const namespaces, podsPerNamespace, nodes = 10, 100, 100
	data := storagetesting.PrepareBenchmarkData(namespaces, podsPerNamespace, nodes)
	b.Run(fmt.Sprintf("Namespaces=%d/Pods=%d/Nodes=%d", namespaces, namespaces*podsPerNamespace, nodes), func(b *testing.B) {
		e := setup(b)
		b.ResetTimer()
		storagetesting.RunBenchmarkWriteThroughput(e.ctx, b, e.store, data, false, nil)
	})
}

// seededStore returns a fresh store holding data's pods, created one by one
// from revision 2 on (RunBenchmarkStoreList derives exact RVs from that).
func seededStore(b *testing.B, data storagetesting.BenchmarkData) *env {
	e := setup(b)
	if err := storagetesting.PrecreateBenchmarkPods(e.ctx, e.store, data); err != nil {
		b.Fatal(err)
	}
	return e
}

func BenchmarkStoreList(b *testing.B) {
	const namespaces, podsPerNamespace, nodes = 100, 100, 500
	data := storagetesting.PrepareBenchmarkData(namespaces, podsPerNamespace, nodes)
	e := seededStore(b, data)
	b.Run(fmt.Sprintf("Namespaces=%d/Pods=%d/Nodes=%d", namespaces, namespaces*podsPerNamespace, nodes), func(b *testing.B) {
		storagetesting.RunBenchmarkStoreList(e.ctx, b, e.store, data, false)
	})
}

func BenchmarkStoreStats(b *testing.B) {
	e := seededStore(b, storagetesting.PrepareBenchmarkData(50, 100, 100))
	storagetesting.RunBenchmarkStoreStats(e.ctx, b, e.store)
}
