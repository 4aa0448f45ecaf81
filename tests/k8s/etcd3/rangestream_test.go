package etcd3

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"

	"github.com/engramkv/engram/tests/k8s/internal/backend"
	"github.com/engramkv/engram/tests/k8s/internal/fixture"
)

// Kubernetes 1.37 reads recursive lists, and a watch's initial state, with
// etcd 3.7's RangeStream RPC (gate EtcdRangeStream). These tests re-create,
// on exported API, the RangeStream tests of upstream's
// pkg/storage/etcd3/{store,watcher}_test.go that reach the server. Upstream
// counts calls with an unexported KV wrapper; here backend.RangeRPCs records
// the RPCs on the wire, so a list counts as streamed only if the server
// answered the RangeStream itself: a server without it answers Unimplemented
// and the store reads paginated instead, which these tests report as a
// failure.

// checkStreamed checks the RPCs t's store sent since the last check: with
// the gate on, at least one RangeStream answered in full, none refused as
// Unimplemented, and the store still counting on RangeStream; with it off,
// no RangeStream at all.
func (e *env) checkStreamed(t *testing.T, gateOn bool) {
	t.Helper()
	streams := e.rpcs.Streams()
	if !gateOn {
		if len(streams) > 0 {
			t.Errorf("EtcdRangeStream off, yet the store sent %d RangeStream requests", len(streams))
		}
		return
	}
	served := 0
	for _, s := range streams {
		if s.Err == nil {
			served++
		}
		if status.Code(s.Err) == codes.Unimplemented {
			t.Errorf("the server answered RangeStream(%q) with %v", s.Key, s.Err)
		}
	}
	if served == 0 {
		t.Errorf("no list was served by RangeStream (%d RangeStream requests, none answered in full)", len(streams))
	}
	if !fixture.RangeStreamSupported() {
		t.Error("the store marked RangeStream unsupported: it fell back to paginated Range")
	}
}

// TestGetListStreamMultiChunk re-creates upstream's test of the same name: a
// list of more objects than the server puts in one chunk (etcd sends 10 keys
// first) is one RangeStream of several chunks, assembled into one unpaginated
// list; pinned to a resourceVersion (Exact) it shows that snapshot, later
// writes excluded; a minimum resourceVersion (NotOlderThan) shows the latest
// state. Each list is also checked against the RPCs: one RangeStream of more
// than one chunk, and no unary Range of the pods.
func TestGetListStreamMultiChunk(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, true)
	e := setup(t)
	const pods = 25
	for i := range pods {
		createPodIn(t, e, "ns", fmt.Sprintf("pod-%02d", i))
	}
	e.rpcs.Streams()
	e.rpcs.Ranges("")

	list := func(t *testing.T, rv string, match metav1.ResourceVersionMatch) *example.PodList {
		t.Helper()
		out := &example.PodList{}
		opts := storage.ListOptions{ResourceVersion: rv, ResourceVersionMatch: match, Predicate: storage.Everything, Recursive: true}
		if err := e.store.GetList(e.ctx, "/pods/", opts, out); err != nil {
			t.Fatalf("GetList(rv %q, match %q): %v", rv, match, err)
		}
		streams := e.rpcs.Streams()
		if len(streams) != 1 || streams[0].Err != nil || streams[0].Chunks < 2 {
			t.Errorf("list (rv %q, match %q): want one RangeStream answered in several chunks, got %+v", rv, match, streams)
		}
		if ranges := e.rpcs.Ranges("/pods/"); len(ranges) > 0 {
			t.Errorf("list (rv %q, match %q) also sent unary Range requests for %q", rv, match, ranges)
		}
		if out.Continue != "" || out.RemainingItemCount != nil {
			t.Errorf("a streamed list is not paginated, got continue %q, remainingItemCount %v", out.Continue, out.RemainingItemCount)
		}
		return out
	}

	snapshot := list(t, "", "")
	if len(snapshot.Items) != pods {
		t.Errorf("consistent list: %d items, want %d", len(snapshot.Items), pods)
	}
	createPodIn(t, e, "ns", "pod-extra")
	e.rpcs.Ranges("")

	exact := list(t, snapshot.ResourceVersion, metav1.ResourceVersionMatchExact)
	if len(exact.Items) != pods {
		t.Errorf("exact list at %s: %d items, want %d", snapshot.ResourceVersion, len(exact.Items), pods)
	}
	if exact.ResourceVersion != snapshot.ResourceVersion {
		t.Errorf("exact list: resourceVersion %s, want %s", exact.ResourceVersion, snapshot.ResourceVersion)
	}
	notOlder := list(t, snapshot.ResourceVersion, "")
	if len(notOlder.Items) != pods+1 {
		t.Errorf("notOlderThan list: %d items, want %d", len(notOlder.Items), pods+1)
	}
	if !fixture.RangeStreamSupported() {
		t.Error("the store marked RangeStream unsupported")
	}
}

// TestGetListStreamCompacted is upstream's TestWatchChanSyncStreamCompactionError
// on the list path: a stream pinned to a compacted revision fails with the
// server's compaction error, which the store reports as 410 Expired, not as
// a missing RangeStream.
func TestGetListStreamCompacted(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, true)
	e := setup(t)
	first := createPodIn(t, e, "ns", "a")
	second := createPodIn(t, e, "ns", "b")
	fixture.Compact(e.ctx, t, e.client.Client, second.ResourceVersion)
	e.rpcs.Streams()

	opts := storage.ListOptions{ResourceVersion: first.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact,
		Predicate: storage.Everything, Recursive: true}
	err := e.store.GetList(e.ctx, "/pods/", opts, &example.PodList{})
	if !apierrors.IsResourceExpired(err) {
		t.Fatalf("list at compacted revision %s: got %v, want 410 Expired", first.ResourceVersion, err)
	}
	streams := e.rpcs.Streams()
	if len(streams) != 1 || status.Code(streams[0].Err) != codes.OutOfRange {
		t.Errorf("want one RangeStream refused with OutOfRange (compacted), got %+v", streams)
	}
	if !fixture.RangeStreamSupported() {
		t.Error("the store marked RangeStream unsupported")
	}
}

// TestWatchSyncStreamMatchesPaginated re-creates upstream's
// TestWatchChanSyncStreamMatchesPaginated on exported API: a recursive watch
// from resourceVersion 0 first sends every current object as ADDED; read
// with one RangeStream (gate on) or paginated Ranges (gate off) it sends the
// same objects at the same revisions.
func TestWatchSyncStreamMatchesPaginated(t *testing.T) {
	e := setup(t)
	for i := range 20 {
		createPodIn(t, e, fmt.Sprintf("ns-%d", i%3), fmt.Sprintf("pod-%d", i))
	}
	initial := map[bool][]string{}
	for _, rangeStream := range []bool{true, false} {
		t.Run(fmt.Sprintf("RangeStream=%v", rangeStream), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, rangeStream)
			e.rpcs.Streams()
			e.rpcs.Ranges("")
			var streams []backend.StreamCall
			initial[rangeStream] = initialEvents(t, e, 20, func() {
				if !rangeStream {
					streams = e.rpcs.Streams()
					return
				}
				// The watch hands out its initial events as the stream's
				// chunks arrive, so the stream's end may be read after
				// the 20th event; stopping the watch before then would
				// cancel the stream.
				ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
				streams = e.rpcs.WaitStreams(ctx, 1)
				cancel()
			})
			if rangeStream && (len(streams) != 1 || streams[0].Err != nil || streams[0].Key != "/pods/") {
				t.Errorf("want one RangeStream of /pods/ answered in full, got %+v", streams)
			}
			if !rangeStream && len(streams) > 0 {
				t.Errorf("EtcdRangeStream off, yet the watch sent RangeStream requests: %+v", streams)
			}
			if ranges := e.rpcs.Ranges("/pods/"); rangeStream == (len(ranges) > 0) {
				t.Errorf("unary Range requests for the pods: %q", ranges)
			}
		})
	}
	if !slices.Equal(initial[true], initial[false]) {
		t.Errorf("initial events differ:\nRangeStream: %q\npaginated:   %q", initial[true], initial[false])
	}
	if !fixture.RangeStreamSupported() {
		t.Error("the store marked RangeStream unsupported")
	}
}

// initialEvents watches all pods from resourceVersion 0 and returns the
// first n events as "TYPE key@rv", sorted. beforeStop, if not nil, runs
// after the n-th event while the watch is still open.
func initialEvents(t *testing.T, e *env, n int, beforeStop func()) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, wait.ForeverTestTimeout)
	defer cancel()
	w, err := e.store.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: "0", Predicate: storage.Everything, Recursive: true})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Stop()
	var got []string
	for len(got) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed after %d events: %q", len(got), got)
			}
			if ev.Type == watch.Error {
				t.Fatalf("watch error: %v", apierrors.FromObject(ev.Object))
			}
			pod := ev.Object.(*example.Pod)
			got = append(got, fmt.Sprintf("%s /pods/%s/%s@%s", ev.Type, pod.Namespace, pod.Name, pod.ResourceVersion))
		case <-ctx.Done():
			// Not a timing assertion: the events are already stored, so
			// only a hang gets here.
			t.Fatalf("after %d of %d initial events: %v", len(got), n, ctx.Err())
		}
	}
	if beforeStop != nil {
		beforeStop()
	}
	slices.Sort(got)
	return got
}

func createPodIn(t *testing.T, e *env, ns, name string) *example.Pod {
	t.Helper()
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	out := &example.Pod{}
	if err := e.store.Create(e.ctx, fixture.PodKey(pod), pod, out, 0); err != nil {
		t.Fatalf("Create %s/%s: %v", ns, name, err)
	}
	return out
}
