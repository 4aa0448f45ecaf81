package etcd3

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	etcdrpc "go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/engramkv/engram/tests/k8s/internal/fixture"
)

// Implementation-level checks. Upstream's etcd3 package has more tests than
// the exported Run* suite; most of them inspect unexported state of the
// store (lease manager counters, watchChan internals, key preparation) and
// never reach the server beyond what the suite covers. The ones below only
// need exported API and do exercise server behaviour the apiserver relies
// on, so they are re-created here in our own words.

func createPod(t *testing.T, e *env, name string) *example.Pod {
	t.Helper()
	in := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	out := &example.Pod{}
	if err := e.store.Create(e.ctx, fixture.PodKey(in), in, out, 0); err != nil {
		t.Fatalf("Create %s: %v", name, err)
	}
	return out
}

func parseRV(t *testing.T, rv string) uint64 {
	t.Helper()
	v, err := storage.APIObjectVersioner{}.ParseResourceVersion(rv)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The store's "current RV" (a limit-1 Range on the resource prefix) must be
// the server-wide revision, not the newest revision under the prefix.
func TestGetCurrentResourceVersion(t *testing.T) {
	e := setup(t)
	pod := createPod(t, e, "p1")
	podRV := parseRV(t, pod.ResourceVersion)
	if cur, err := e.store.GetCurrentResourceVersion(e.ctx); err != nil || cur != podRV {
		t.Fatalf("after Create: current RV %d (err %v), want the pod's RV %d", cur, err, podRV)
	}

	put, err := e.client.Put(e.ctx, "/unrelated/key", "x")
	if err != nil {
		t.Fatal(err)
	}
	if cur, err := e.store.GetCurrentResourceVersion(e.ctx); err != nil || cur != uint64(put.Header.Revision) {
		t.Fatalf("after an unrelated Put: current RV %d (err %v), want the Put's revision %d", cur, err, put.Header.Revision)
	}

	got := &example.Pod{}
	if err := e.store.Get(e.ctx, fixture.PodKey(pod), storage.GetOptions{}, got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != pod.ResourceVersion {
		t.Errorf("unrelated write changed the pod's RV from %s to %s", pod.ResourceVersion, got.ResourceVersion)
	}
}

// Linearizable reads must not advance the revision: the RV a LIST returns is
// client-visible.
func TestLinearizedReadRevisionInvariant(t *testing.T) {
	e := setup(t)
	pod := createPod(t, e, "p1")
	for i := 0; i < 5; i++ {
		if _, err := e.client.KV.Get(e.ctx, "/pods/ns/p1"); err != nil {
			t.Fatal(err)
		}
	}
	list := &example.PodList{}
	if err := e.store.GetList(e.ctx, "/pods/", storage.ListOptions{Predicate: storage.Everything, Recursive: true}, list); err != nil {
		t.Fatal(err)
	}
	if list.ResourceVersion != pod.ResourceVersion {
		t.Fatalf("LIST RV after 5 reads is %s, want the create's %s", list.ResourceVersion, pod.ResourceVersion)
	}
}

// A WatchList (sendInitialEvents) from a resourceVersion the server has not
// reached yet must end in a 504 TooLargeResourceVersion with Retry-After,
// which requires the server's future-revision error on Range.
func TestTooLargeResourceVersionErrorForWatchList(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.WatchList, true)
	e := setup(t)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	pred := storage.Everything
	pred.AllowWatchBookmarks = true
	w, err := e.store.Watch(ctx, "/pods/", storage.ListOptions{
		ResourceVersion:   "102",
		SendInitialEvents: ptr.To(true),
		Recursive:         true,
		Predicate:         pred,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	var ev watch.Event
	select {
	case ev = <-w.ResultChan():
	case <-time.After(30 * time.Second):
		t.Fatal("no event within 30s")
	}
	status, ok := ev.Object.(*metav1.Status)
	if ev.Type != watch.Error || !ok {
		t.Fatalf("got %s %#v, want an Error event with a Status", ev.Type, ev.Object)
	}
	// A fresh server is at revision 1.
	var want *apierrors.StatusError
	if !errors.As(storage.NewTooLargeResourceVersionError(102, 1, 0), &want) {
		t.Fatal("NewTooLargeResourceVersionError is not a StatusError")
	}
	if status.Details == nil || status.Details.RetryAfterSeconds <= 0 {
		t.Fatalf("status %+v has no Retry-After", status)
	}
	if status.Code != want.ErrStatus.Code || status.Reason != want.ErrStatus.Reason || status.Message != want.ErrStatus.Message {
		t.Fatalf("got %d %s %q, want %d %s %q", status.Code, status.Reason, status.Message,
			want.ErrStatus.Code, want.ErrStatus.Reason, want.ErrStatus.Message)
	}
}

// Stats counts (Count RPC) or, with size estimation, lists keys only under
// <prefix>/pods/, never the neighbouring keys.
func TestPrefixStats(t *testing.T) {
	for _, estimate := range []bool{false, true} {
		t.Run(fmt.Sprintf("Estimate=%v", estimate), func(t *testing.T) {
			e := setup(t, withPrefix("/registry"), withResourcePrefix("/pods/"))
			if estimate {
				if err := e.store.EnableResourceSizeEstimation(e.keysOnly("/registry/pods/")); err != nil {
					t.Fatal(err)
				}
			}
			for k, v := range map[string]string{"key": "a", "/registry/key": "ab", "/registry/pods/key": "abc", "/registry/podskey": "abcd"} {
				if _, err := e.client.Put(e.ctx, k, v); err != nil {
					t.Fatal(err)
				}
			}
			// The values are not pods; the LIST fails to decode them but
			// still feeds the size estimator.
			_ = e.store.GetList(e.ctx, "/pods/", storage.ListOptions{Predicate: storage.Everything, Recursive: true}, &example.PodList{})
			got, err := e.store.Stats(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := storage.Stats{ObjectCount: 1}
			if estimate {
				want.EstimatedAverageObjectSizeBytes = 3
			}
			if got != want {
				t.Fatalf("Stats() = %+v, want %+v", got, want)
			}
		})
	}
}

// Three apiserver compactors sharing one server: compact_rev_key's Version
// is the logical clock, so a compactor with a stale clock loses the Txn and
// learns the current clock and compacted revision instead of compacting.
func TestCompactConflict(t *testing.T) {
	e := setup(t)
	c := e.client.Client
	put, err := c.Put(e.ctx, "/somekey", "data")
	if err != nil {
		t.Fatal(err)
	}
	base := put.Header.Revision

	check := func(step string, gotTime, gotRev, gotCompacted, wantTime, wantRev, wantCompacted int64) {
		t.Helper()
		if gotTime != wantTime || gotRev != wantRev || gotCompacted != wantCompacted {
			t.Errorf("%s: (time, rev, compacted) = (%d, %d, %d), want (%d, %d, %d)",
				step, gotTime, gotRev, gotCompacted, wantTime, wantRev, wantCompacted)
		}
	}

	tm, rev, compacted, err := etcd3.Compact(e.ctx, c, 0, base)
	if err != nil {
		t.Fatal(err)
	}
	// Wins: writes compact_rev_key (one revision) and compacts.
	check("first compactor at time 0", tm, rev, compacted, 1, base+1, base)

	tm, rev, compacted, err = etcd3.Compact(e.ctx, c, 0, base+1)
	if err != nil {
		t.Fatal(err)
	}
	// Loses: nothing written, reports the winner's time and revision.
	check("second compactor at time 0", tm, rev, compacted, 1, base+1, base)

	tm, rev, compacted, err = etcd3.Compact(e.ctx, c, 1, base+1)
	if err != nil {
		t.Fatal(err)
	}
	check("third compactor at time 1", tm, rev, compacted, 2, base+2, base+1)
}

// The periodic compactor kube-apiserver runs (--etcd-compaction-interval),
// driven by a fake clock: each tick compacts to the revision observed on the
// previous tick.
func TestCompactor(t *testing.T) {
	e := setup(t)
	c := e.client.Client
	clk := newArmClock(testingclock.NewFakeClock(time.Now()))
	compactor := etcd3.NewCompactor(c, time.Minute, clk, nil)
	t.Cleanup(compactor.Stop)

	tick := func() {
		t.Helper()
		waitForTimer(t, clk)
		clk.Step(time.Minute)
		// The loop re-arms its timer once the tick's Txn and Compact are done.
		waitForTimer(t, clk)
	}
	put := func(v string) int64 {
		t.Helper()
		resp, err := c.Put(e.ctx, "/somekey", v)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	expectCompactRevision := func(want int64) {
		t.Helper()
		if got := compactor.CompactRevision(); got != want {
			t.Errorf("CompactRevision() = %d, want %d", got, want)
		}
	}

	tick() // records the current revision, compacts nothing
	expectCompactRevision(0)

	r1 := put("v1")
	expectReadable(t, c, r1)
	tick() // compacts to the revision before r1
	expectReadable(t, c, r1)
	expectCompactRevision(r1 - 1)

	r2 := put("v2")
	tick() // compacts to r1+1 (the compact_rev_key write after r1)
	expectCompacted(t, c, r1)
	expectReadable(t, c, r2)
	expectCompactRevision(r1 + 1)

	tick()
	expectCompacted(t, c, r2)
	expectCompactRevision(r2 + 1)
}

// armClock is a fake clock that says when a timer is armed on it, so a test
// can wait for the compactor to arm its timer instead of polling for it.
type armClock struct {
	*testingclock.FakeClock
	// armed receives a value after each After (at most one pending).
	armed chan struct{}
}

func newArmClock(c *testingclock.FakeClock) *armClock {
	return &armClock{FakeClock: c, armed: make(chan struct{}, 1)}
}

func (c *armClock) After(d time.Duration) <-chan time.Time {
	ch := c.FakeClock.After(d)
	select {
	case c.armed <- struct{}{}:
	default: // a wake-up is already pending
	}
	return ch
}

// waitForTimer waits until a timer is armed on clk. A pending wake-up may
// be from a timer that already fired, hence the loop; the ten seconds only
// guard against a hang.
func waitForTimer(t *testing.T, clk *armClock) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for !clk.HasWaiters() {
		select {
		case <-clk.armed:
		case <-timeout:
			t.Fatal("the compactor is not waiting on its timer")
		}
	}
}

func expectCompacted(t *testing.T, c *clientv3.Client, rev int64) {
	t.Helper()
	// The apiserver compares with ==, so the error must map exactly.
	if _, err := c.Get(context.Background(), "/somekey", clientv3.WithRev(rev)); err != etcdrpc.ErrCompacted {
		t.Errorf("Get at revision %d: err = %v, want %v", rev, err, etcdrpc.ErrCompacted)
	}
}

func expectReadable(t *testing.T, c *clientv3.Client, rev int64) {
	t.Helper()
	if _, err := c.Get(context.Background(), "/somekey", clientv3.WithRev(rev)); err != nil {
		t.Errorf("Get at revision %d: %v", rev, err)
	}
}
