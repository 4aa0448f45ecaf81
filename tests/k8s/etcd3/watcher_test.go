package etcd3

import (
	"testing"

	"k8s.io/apiserver/pkg/features"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
)

// The watcher tests of k8s.io/apiserver/pkg/storage/testing, wired like
// k8s.io/apiserver/pkg/storage/etcd3/watcher_test.go wires them. Each test
// runs on a fresh server whose progress-notify interval is 1s
// (backend.ProgressNotifyInterval), as TestProgressNotify and
// TestWatchDispatchBookmarkEvents require.
//
// Not run here: RunTestOptionalWatchBookmarksWithCorrectResourceVersion.
// The etcd3 store never turns progress notifications into bookmarks for a
// client's allowWatchBookmarks (only the cacher does; upstream runs it in the
// cacher suite only, and so do we: see ../cacher).

func TestWatch(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestWatch(e.ctx, t, e.store)
}

func TestClusterScopedWatch(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestClusterScopedWatch(e.ctx, t, e.store)
}

func TestNamespaceScopedWatch(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestNamespaceScopedWatch(e.ctx, t, e.store)
}

func TestDeleteTriggerWatch(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestDeleteTriggerWatch(e.ctx, t, e.store)
}

func TestWatchFromZero(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestWatchFromZero(e.ctx, t, e.store, e.compaction())
}

func TestWatchFromNonZero(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestWatchFromNonZero(e.ctx, t, e.store)
}

func TestDelayedWatchDelivery(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestDelayedWatchDelivery(e.ctx, t, e.store)
}

func TestWatchError(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestWatchError(e.ctx, t, e.withPrefixTransformer())
}

func TestWatchContextCancel(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestWatchContextCancel(e.ctx, t, e.store)
}

func TestWatcherTimeout(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestWatcherTimeout(e.ctx, t, e.store)
}

func TestWatchDeleteEventObjectHaveLatestRV(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV(e.ctx, t, e.store)
}

func TestWatchInitializationSignal(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestWatchInitializationSignal(e.ctx, t, e.store)
}

func TestProgressNotify(t *testing.T) {
	e := setup(t)
	storagetesting.RunOptionalTestProgressNotify(e.ctx, t, e.store, e.increaseRV())
}

func TestWatchWithUnsafeDelete(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)
	e := setup(t)
	storagetesting.RunTestWatchWithUnsafeDelete(e.ctx, t, e.withTransformerOverride(), corruptObjectError(t))
}

func TestWatchDispatchBookmarkEvents(t *testing.T) {
	e := setup(t)
	// false: the etcd3 store must not send bookmarks even when asked.
	storagetesting.RunTestWatchDispatchBookmarkEvents(e.ctx, t, e.store, false)
}

func TestSendInitialEventsBackwardCompatibility(t *testing.T) {
	e := setup(t)
	storagetesting.RunSendInitialEventsBackwardCompatibility(e.ctx, t, e.store)
}

// Upstream runs the watch semantics with EtcdRangeStream off and on; none of
// their watches reads its initial state with a recursive list, so no
// RangeStream is sent either way (checked against etcd 3.7) and they run
// once. TestWatchSyncStreamMatchesPaginated covers the streamed sync.
func TestWatchSemantics(t *testing.T) {
	e := setup(t)
	storagetesting.RunWatchSemantics(e.ctx, t, e.store)
}

func TestWatchSemanticsWithConcurrentDecode(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ConcurrentWatchObjectDecode, true)
	e := setup(t)
	storagetesting.RunWatchSemantics(e.ctx, t, e.store)
}

func TestWatchSemanticInitialEventsExtended(t *testing.T) {
	e := setup(t)
	storagetesting.RunWatchSemanticInitialEventsExtended(e.ctx, t, e.store)
}

func TestWatchListMatchSingle(t *testing.T) {
	e := setup(t)
	storagetesting.RunWatchListMatchSingle(e.ctx, t, e.store)
}

func TestWatchErrorIsBlockingFurtherEvents(t *testing.T) {
	e := setup(t)
	storagetesting.RunWatchErrorIsBlockingFurtherEvents(e.ctx, t, e.withPrefixTransformer())
}
