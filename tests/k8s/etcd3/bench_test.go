package etcd3

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/apis/example"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"

	"github.com/engramkv/engram/tests/k8s/internal/fixture"
)

// The suite's store benchmarks (not part of `go test`; run with -bench).
// Upstream sizes them after the Kubernetes scalability thresholds (up to
// 150k pods per data set); here one data set of 10k pods keeps the set-up
// under a minute on a small machine. Compare backends with benchstat:
//
//	go test -run '^$' -bench . -benchtime 200x ./etcd3/ > engram.txt
//	go test -tags etcdref -run '^$' -bench . -benchtime 200x ./etcd3/ > etcd.txt

func BenchmarkStoreListCreate(b *testing.B) {
	for _, match := range []metav1.ResourceVersionMatch{metav1.ResourceVersionMatchNotOlderThan, metav1.ResourceVersionMatchExact} {
		b.Run("RV="+string(match), func(b *testing.B) {
			e := setup(b)
			storagetesting.RunBenchmarkStoreListCreate(e.ctx, b, e.store, match)
		})
	}
}

// seededStore returns a fresh store holding data's pods, created one by one
// from revision 2 on (RunBenchmarkStoreList derives exact RVs from that).
func seededStore(b *testing.B, data storagetesting.BenchmarkData) *env {
	e := setup(b)
	out := &example.Pod{}
	for _, pod := range data.Pods {
		if err := e.store.Create(e.ctx, fixture.PodKey(pod), pod, out, 0); err != nil {
			b.Fatal(err)
		}
	}
	return e
}

func BenchmarkStoreList(b *testing.B) {
	const namespaces, podsPerNamespace, nodes = 100, 100, 500
	data := storagetesting.PrepareBenchchmarkData(namespaces, podsPerNamespace, nodes)
	e := seededStore(b, data)
	b.Run(fmt.Sprintf("Namespaces=%d/Pods=%d/Nodes=%d", namespaces, namespaces*podsPerNamespace, nodes), func(b *testing.B) {
		storagetesting.RunBenchmarkStoreList(e.ctx, b, e.store, data, false)
	})
}

func BenchmarkStoreStats(b *testing.B) {
	e := seededStore(b, storagetesting.PrepareBenchchmarkData(50, 100, 100))
	storagetesting.RunBenchmarkStoreStats(e.ctx, b, e.store)
}
