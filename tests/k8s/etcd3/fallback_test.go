//go:build !etcdref

package etcd3

import (
	"fmt"
	"os"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"

	"github.com/engramkv/engram/internal/etcdtest"
	"github.com/engramkv/engram/tests/k8s/internal/backend"
	"github.com/engramkv/engram/tests/k8s/internal/fixture"
)

// TestStreamFallsBackOnEtcd36 re-creates upstream's
// TestGetListStreamFallsBackToPaginated and
// TestWatchChanSyncStreamFallsBackToPaginated against a real server without
// RangeStream, etcd 3.6 (make etcd-tools builds it), where upstream stubs the
// client. Its gRPC server answers the unknown method with Unimplemented: the
// store must then read the list (and the watch's initial state) with
// paginated Range, return every object, and stop sending RangeStream.
// It needs no Engram, so it runs with the default backend only.
func TestStreamFallsBackOnEtcd36(t *testing.T) {
	if b := os.Getenv(backend.BackendEnv); b != "" {
		t.Skipf("%s=%s: the test runs on etcd 3.6 whatever the backend; the default run has it", backend.BackendEnv, b)
	}
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, true)
	etcd := etcdtest.Start(t, etcdtest.Options{Release: etcdtest.Release36})
	e := setup(t, withEndpoint(etcd.Endpoint))
	const pods = 5
	for i := range pods {
		createPodIn(t, e, "ns", fmt.Sprintf("pod-%d", i))
	}
	e.rpcs.Ranges("")

	// wantFallback checks that the last operation sent one RangeStream,
	// refused as Unimplemented, and then read the pods with Range.
	wantFallback := func(t *testing.T) {
		t.Helper()
		streams := e.rpcs.Streams()
		if len(streams) != 1 || status.Code(streams[0].Err) != codes.Unimplemented {
			t.Errorf("want one RangeStream refused as Unimplemented, got %+v", streams)
		}
		if len(e.rpcs.Ranges("/pods/")) == 0 {
			t.Error("no paginated Range of the pods after the fallback")
		}
		if fixture.RangeStreamSupported() {
			t.Error("the store did not mark RangeStream unsupported")
		}
	}

	t.Run("GetList", func(t *testing.T) {
		list := func() int {
			out := &example.PodList{}
			if err := e.store.GetList(e.ctx, "/pods/", storage.ListOptions{Predicate: storage.Everything, Recursive: true}, out); err != nil {
				t.Fatalf("GetList: %v", err)
			}
			return len(out.Items)
		}
		if n := list(); n != pods {
			t.Errorf("list after the fallback: %d items, want %d", n, pods)
		}
		wantFallback(t)
		// Marked unsupported, the store does not ask again.
		if n := list(); n != pods {
			t.Errorf("second list: %d items, want %d", n, pods)
		}
		if streams := e.rpcs.Streams(); len(streams) > 0 {
			t.Errorf("the second list sent RangeStream again: %+v", streams)
		}
		e.rpcs.Ranges("")
	})

	t.Run("WatchSync", func(t *testing.T) {
		fixture.FreshFeatureSupport(t)
		if got := initialEvents(t, e, pods, nil); len(got) != pods {
			t.Errorf("initial events: %q", got)
		}
		wantFallback(t)
	})
}
